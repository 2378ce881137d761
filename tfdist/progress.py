"""How far this task's training has got, for the launcher's hang deadline: calls of the
compiled steps begun and finished, the epoch and step, and whether the task is idle (an
epoch's end: evaluation, checkpoint saves, the user's `on_epoch_end`; an evaluator waiting).

Recording is a few attribute writes, no collective and no file: the launched task's heartbeat
thread (`tfdist.launch.liveness`) writes `snapshot()` into its heartbeat file once a second.
Every training path records here: `tfdist.fit` (a callback, the parameter-server loop
included), `tfdist.TrainingLoop` and the evaluator.

```python
progress.begin_call(epoch=1, step=40)   # about to run a call of the compiled steps
progress.finish_call()
progress.idle()                         # an epoch's end: the launcher's clock pauses
```
"""

from __future__ import annotations

import threading
import time

CALL, BETWEEN, IDLE = "call", "between", "idle"
_lock = threading.Lock()
_state = {"begun": 0, "finished": 0, "epoch": 0, "step": 0, "phase": IDLE, "slowest": 0.0}
_started_at: list[float] = []


def begin_call(epoch: int | None = None, step: int | None = None) -> None:
  """A call of the compiled steps begins (it may wait for the peers' collectives); `step`:
  the steps of `epoch` done before it."""
  with _lock:
    _state["begun"] += 1
    _state["phase"] = CALL
    if epoch is not None:
      _state["epoch"] = int(epoch)
    if step is not None:
      _state["step"] = int(step)
    _started_at[:] = [time.monotonic()]


def finish_call(step: int | None = None) -> None:
  """The call that began last has ended (`step`: the steps of the epoch done by now)."""
  with _lock:
    if step is not None:
      _state["step"] = int(step)
    _state["finished"] = _state["begun"]
    _state["phase"] = BETWEEN
    if _started_at:
      _state["slowest"] = max(_state["slowest"], time.monotonic() - _started_at[0])
    _started_at.clear()


def between(epoch: int | None = None) -> None:
  """Training goes on (a new epoch begins): the launcher's clock runs."""
  with _lock:
    _state["phase"] = BETWEEN
    if epoch is not None:
      _state["epoch"] = int(epoch)


def idle() -> None:
  """Work that is not a training call and may take long on one task alone: the clock pauses."""
  with _lock:
    _state["phase"] = IDLE


def snapshot() -> dict:
  """The progress so far: begun, finished, epoch (0-based), step (steps of the epoch done),
  phase, and the slowest call's seconds."""
  with _lock:
    return dict(_state)


_unclean_end: list[str] = []


def end_unclean(why: str) -> None:
  """This process ends on a failure or a preemption, not at its script's clean end: it leaves
  at once rather than waiting for its peers at exit (`strategy.factory`'s exit barrier)."""
  _unclean_end.append(why)


def ends_clean() -> bool:
  return not _unclean_end
