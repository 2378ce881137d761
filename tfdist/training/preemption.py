"""Preemption: a termination notice during `tfdist.fit` or `tfdist.TrainingLoop` makes every
worker save its backup at the same step and exit with `PREEMPTED`, so the restarted job resumes
at that step.

Clusters take machines back after a notice and a grace period: Kubernetes and Slurm send
SIGTERM, Slurm's `--signal` another signal before a time limit (`checkpoint.preemption_signal`).
A task that gets one finishes the call it is in (`training.steps_per_execution` steps at most)
and, with its peers, saves its backup (weights, optimizer, epoch and step within it) and
exits. MultiWorkerMirrored workers agree on the call to stop after with a `Vote` after every
call (`training.agreement`). TensorFlow's `PreemptionCheckpointHandler`
does the same job with its own checkpoint manager and step counter; this one keeps Keras's
`fit` and tfdist's backup, which already resumes every strategy.

```python
notice = Notice([signal.SIGTERM], strategy=strategy)
callbacks = [backup, Preemption(backup, notice)]
```
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

import keras

import tfdist.progress as progress
from tfdist.training import agreement
from tfdist.exit_codes import PREEMPTED


class Notice:
  """A termination notice, as every worker of a run agrees on it: SIGTERM or another of
  `signals` noticed between calls of the compiled steps, asked after each call.

  Args:
    signals: the signals taken as a notice.
    strategy: the MultiWorkerMirrored strategy whose workers must agree; None for one process.
  """

  def __init__(self, signals, *, strategy=None):
    self.signals = tuple(signals)
    self.noticed = threading.Event()
    self._vote = None if strategy is None else agreement.Vote(
        strategy, progress.Collective.PREEMPTION_AGREEMENT)
    self._previous: dict = {}

  @contextlib.contextmanager
  def listening(self):
    """Takes the signals while inside (the main thread only: Python's rule), then gives the
    previous handlers back."""
    self.listen()
    try:
      yield self
    finally:
      self.stop_listening()

  def listen(self) -> None:
    if threading.current_thread() is threading.main_thread() and not self._previous:
      self._previous = {s: signal.signal(s, self._on_signal) for s in self.signals}

  def stop_listening(self) -> None:
    for s, handler in self._previous.items():
      signal.signal(s, handler)
    self._previous = {}

  def exit_preempted(self, where: str, say=print) -> None:
    """Says where the backup was saved and exits with `PREEMPTED`, deaf to further notices
    while the process ends: Slurm's srun stops a step's other tasks (SIGTERM) once one exits
    42, and a task still tearing TensorFlow down would die of it, not exit 42 (seen on a real
    Slurm)."""
    if threading.current_thread() is threading.main_thread():
      for s in self.signals:
        signal.signal(s, signal.SIG_IGN)
    self._previous = {}
    progress.end_unclean("preempted")  # Every peer saved too: none waits for another.
    say(f"tfdist: preempted: backup saved at {where}; exiting with {PREEMPTED} (restart to "
        "resume there)")
    sys.stdout.flush()
    raise SystemExit(PREEMPTED)

  def _on_signal(self, signum, frame) -> None:
    del frame
    if not self.noticed.is_set():
      self.noticed.set()
      print(f"tfdist: {signal.Signals(signum).name} received: saving the backup after this "
            "call's steps", flush=True)

  def stop_now(self) -> bool:
    """Whether to save and exit after the call just ended: the same answer on every worker
    (each asks after every call; the first call after any worker's notice stops all)."""
    noticed = self.noticed.is_set()
    return noticed if self._vote is None else self._vote.any(noticed)


class Preemption(keras.callbacks.Callback):
  """Saves `backup` at the same step on every worker after a termination notice, then exits
  (Keras's loop; `tfdist.TrainingLoop` asks its `Notice` itself).

  Args:
    backup: tfdist's `checkpoints.Backup` of this task: it counts the epoch and the steps
      done (a resumed partial epoch's too), for its own backups and this save alike.
    notice: the run's `Notice`.
    say: prints a line (the chief's start line's printer).
  """

  def __init__(self, backup, notice: Notice, *, say=print):
    super().__init__()
    self.backup, self.notice, self.say = backup, notice, say

  def on_train_begin(self, logs=None):
    self.notice.listen()

  def on_train_end(self, logs=None):
    self.notice.stop_listening()

  def on_train_batch_end(self, batch, logs=None):
    if not self.notice.stop_now():
      return
    epoch, step = self.backup.position(batch, self.params.get("steps"))
    self.backup.save_position(epoch, step)
    self.notice.exit_preempted(
        f"epoch {epoch + 1}, step {step}" if step else f"the end of epoch {epoch}", self.say)


def signals_of(name: str) -> list:
  """SIGTERM and the config's `checkpoint.preemption_signal` (a name such as "SIGUSR1")."""
  extra = getattr(signal, name)
  return [signal.SIGTERM] + ([extra] if extra != signal.SIGTERM else [])
