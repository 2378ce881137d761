"""Where this task's training stands, for the launcher's hang watch (`tfdist.launch.hangs`): its
phase (a `Phase`), the calls of the compiled steps begun and finished, the batches its input
delivered, and, on a parameter-server coordinator, each worker's scheduled calls.

A task either waits for its peers (in a call, whose steps run collectives, or in a collective
between calls: one of `Collective`) or runs its own code (callbacks, the loop's body, an
epoch's end); the watch blames a task running its own code while its peers wait for it, or,
when every task waits in the same call, the one whose input stopped delivering. So every place a
task can wait is declared here, and every training path records it: `tfdist.fit` (a callback
first and a callback last among the callbacks, the parameter-server loop included),
`tfdist.TrainingLoop`, the evaluator, and each of tfdist's own collectives
(`with progress.collective(Collective.X):`).

Recording is a few attribute writes, no collective and no file: the launched task's heartbeat
thread (`tfdist.launch.liveness`) writes `snapshot()` into its heartbeat file once a second.

```python
progress.begin_call(epoch=1, step=40)   # about to run a call of the compiled steps
progress.finish_call()                  # back in the task's own code
with progress.collective(progress.Collective.PREEMPTION_AGREEMENT):
  ...                                   # a collective between calls
progress.epoch_end()                    # an epoch's end: its own, longer deadline
```
"""

from __future__ import annotations

import contextlib
import enum
import threading
import time
from typing import Callable


class Phase(str, enum.Enum):
  """Where a task stands; the hang watch's rules are by phase (`tfdist.launch.hangs`)."""

  START = "start"
  """Before its first call finished: connecting, building, tracing (the start-up deadline's)."""
  CALL = "call"
  """In a call of the compiled steps (training, evaluation): it may wait for its peers."""
  COLLECTIVE = "collective"
  """In a collective between calls (`Collective`): it waits for its peers."""
  OWN = "own"
  """Its own code between calls: callbacks' batch and epoch-begin hooks, a loop's body."""
  EPOCH_END = "epoch_end"
  """An epoch's end: `on_epoch_end` callbacks, checkpoints; the epoch-end deadline's."""
  DONE = "done"
  """Training over (the script's own end), or an evaluator waiting for a checkpoint."""


WAITS_FOR_PEERS = frozenset({Phase.CALL, Phase.COLLECTIVE})
"""The phases in which a task may wait for a peer that never comes: the rest is its own code."""


class Collective(str, enum.Enum):
  """The collectives a training task runs outside a call of its compiled steps, each marked
  where it runs (`collective`): a task inside one waits for its peers."""

  KERAS_LOOP = "Keras's loop (its metrics' read or reset)"
  """Keras's loop between its callbacks and calls: an epoch's metrics read after its last call
  and reset before its first (an all-reduce each under multi_worker_mirrored: seen blocking in
  `reset_metrics` for a peer stuck in `on_epoch_end`)."""
  PREEMPTION_AGREEMENT = "the preemption agreement"
  """After each call: every worker's "noticed?" summed (`training.preemption`)."""
  BACKUP_AGREEMENT = "the step backups' agreement"
  """At a step backup's due step: whether every worker can afford one (`training.backup_cadence`),
  and the loop's copy of its variables (a replicated metric's read is an all-reduce)."""
  PERIODIC_AVERAGING = "the periodic averaging"
  """`training.average_every`'s all-reduce of the weights (`training.local_sgd`)."""
  STEP_TIMES = "the step times' gather"
  """Each epoch's per-worker step times gathered (`monitoring.step_times`)."""
  SHARDED_GATHER = "the shards' gather"
  """The optimizer state's shards gathered to save them whole (`training.sharded_optimizer`),
  or the weights' to read them outside a step (`training.sharded_parameters`)."""
  COORDINATOR_JOIN = "the coordinator's wait for the workers' calls"
  """Parameter-server training: the chief waits for the calls scheduled on the workers."""
  DATA_SERVICE_NAME = "the tf.data service's run name"
  """Once before training reads through the tf.data service: the first replica's random number
  summed, naming this run's jobs (`training.agreement.agreed_token`)."""
  EXIT_BARRIER = "the exit barrier"
  """At a clean end: every worker leaves together (`strategy.factory`). TensorFlow's
  coordination service waits there holding Python's GIL (`HOLDS_THE_GIL`)."""


HOLDS_THE_GIL = frozenset({Collective.EXIT_BARRIER})
"""Waits TensorFlow makes without releasing Python's GIL (its coordination service's
`wait_at_barrier`: a thread printing each second printed nothing for the 8 s a peer took to
arrive, TensorFlow 2.21): no other thread runs inside, the heartbeat's included. Entering one
writes the heartbeat first (`before_holding_the_gil`) with `gil_held` set, so the launcher
reads the silence that follows as that wait, not as a frozen process."""


_lock = threading.Lock()
_state: dict = {}
_entered = [0.0]  # When the current phase began (monotonic).
_remote: dict[int, list[int]] = {}  # A coordinator's workers: index -> [begun, finished].


def _reset() -> None:
  _state.clear()
  _state.update(phase=Phase.START.value, where="", begun=0, finished=0, drawn=0, moves=0,
                epoch=0, step=0, slowest=0.0, slowest_epoch_end=0.0)
  _entered[0] = time.monotonic()
  _remote.clear()


_reset()


def _enter(phase: Phase, where: str = "") -> None:
  """Moves to `phase` (under the lock): the time spent in the phase left is recorded (an
  epoch's end apart from the rest; start-up and the end not at all)."""
  now = time.monotonic()
  left, spent = Phase(_state["phase"]), now - _entered[0]
  if left == Phase.EPOCH_END:
    _state["slowest_epoch_end"] = max(_state["slowest_epoch_end"], spent)
  elif left not in (Phase.START, Phase.DONE):
    _state["slowest"] = max(_state["slowest"], spent)
  _state.update(phase=phase.value, where=where, moves=_state["moves"] + 1)
  _entered[0] = now


def begin_call(epoch: int | None = None, step: int | None = None, where: str = "") -> None:
  """A call of the compiled steps begins (it may wait for the peers' collectives); `step`:
  the steps of `epoch` done before it; `where`: what the call runs ("" for training)."""
  with _lock:
    _state["begun"] += 1
    if epoch is not None:
      _state["epoch"] = int(epoch)
    if step is not None:
      _state["step"] = int(step)
    _enter(Phase.CALL, where)


def finish_call(step: int | None = None, where: str = "after a call") -> None:
  """The call that began last has ended (`step`: the steps of the epoch done by now): the
  task runs its own code (`where`: the call's callbacks, the loop's body)."""
  with _lock:
    if step is not None:
      _state["step"] = int(step)
    _state["finished"] = _state["begun"]
    _enter(Phase.OWN, where)


def own_code(where: str, epoch: int | None = None) -> None:
  """The task runs its own code (`where`: whose, e.g. "on_train_batch_begin callbacks"); a new
  epoch's index when one begins."""
  with _lock:
    if epoch is not None:
      _state["epoch"] = int(epoch)
    if _state["phase"] != Phase.START.value:
      _enter(Phase.OWN, where)
    else:
      _state["where"] = where


@contextlib.contextmanager
def keras_call(method: str):
  """Keras's own `model.<method>` (evaluate, predict, a `*_on_batch`) of a model under a
  replicated strategy, outside tfdist's own calls: a call whose steps are collectives, which
  every worker must enter. The task is back in the phase it was in after (its script's end
  stays its end)."""
  with _lock:
    before, where = Phase(_state["phase"]), _state["where"]
    _state["begun"] += 1
    _enter(Phase.CALL, f"Keras's model.{method}")
  try:
    yield
  finally:
    with _lock:
      _state["finished"] = _state["begun"]
      _enter(Phase.OWN if before == Phase.START else before, where)


def epoch_end() -> None:
  """An epoch's end begins: the user's `on_epoch_end`, checkpoints (the epoch-end deadline)."""
  with _lock:
    _enter(Phase.EPOCH_END, "at its epoch's end")


def waiting_for_peers(what: Collective) -> None:
  """The task enters `what` and waits there for its peers, until its next phase."""
  with _lock:
    _enter(Phase.COLLECTIVE, what.value)


@contextlib.contextmanager
def collective(what: Collective):
  """Marks a collective run between calls: the task waits in `what` for its peers inside, and
  is back in the phase it was in after. Before its first call the task is still starting (the
  start-up deadline's), so the phase stays START."""
  holds_the_gil = what in HOLDS_THE_GIL
  with _lock:
    before, where = Phase(_state["phase"]), _state["where"]
    if before != Phase.START:
      _enter(Phase.COLLECTIVE, what.value)
    if holds_the_gil:
      _state["gil_held"] = what.value
  if holds_the_gil:
    for write in _before_the_gil:
      write()
  try:
    yield
  finally:
    with _lock:
      _state.pop("gil_held", None)
      if before != Phase.START and _state["phase"] == Phase.COLLECTIVE.value:
        _enter(before, where)


def before_holding_the_gil(write: Callable[[], None]) -> None:
  """`write` (the heartbeat's) runs, in the waiting thread, just before a wait of
  `HOLDS_THE_GIL` begins."""
  _before_the_gil[:] = [write]


_before_the_gil: list[Callable[[], None]] = []


def done() -> None:
  """Training is over: the script's own end is not judged (its exit barrier is a collective)."""
  with _lock:
    _enter(Phase.DONE)


def watch() -> None:
  """A launcher watches this task (its heartbeat runs): its input's batches are counted."""
  _watched.append(True)


def watched() -> bool:
  return bool(_watched)


_watched: list[bool] = []


def count_draws(read: Callable[[], int]) -> None:
  """`read` returns the batches this task's input has delivered (`training.data.counted`)."""
  _draws[:] = [read]


_draws: list[Callable[[], int]] = []


def remote_call(worker: int, finished: bool = False) -> None:
  """A parameter-server coordinator's call on `worker` began (or `finished`)."""
  with _lock:
    counts = _remote.setdefault(int(worker), [0, 0])
    counts[1 if finished else 0] += 1


def snapshot() -> dict:
  """The progress so far: phase, where (a collective's name, whose code), calls begun and
  finished, batches drawn, phase moves, epoch (0-based), step (steps of the epoch done), the
  slowest phase's seconds (an epoch's end apart), and a coordinator's workers' calls
  (`{"1": [begun, finished]}`)."""
  drawn = None
  if _draws:  # Read outside the lock: a TensorFlow op.
    with contextlib.suppress(Exception):  # TensorFlow shutting down: the last count.
      drawn = _draws[0]()
  with _lock:
    if drawn is not None:
      _state["drawn"] = drawn
    return {**_state, "remote": {str(k): list(v) for k, v in sorted(_remote.items())}}


_unclean_end: list[str] = []


def end_unclean(why: str) -> None:
  """This process ends on a failure or a preemption, not at its script's clean end: it leaves
  at once rather than waiting for its peers at exit (`strategy.factory`'s exit barrier)."""
  _unclean_end.append(why)


def ends_clean() -> bool:
  return not _unclean_end
