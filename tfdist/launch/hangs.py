"""A hang told from a slow run: the launcher's reading of its tasks' training progress
(`tfdist.progress`, written into each heartbeat file once a second).

A hang is a cluster whose training has not progressed (no task began or finished a call of its
compiled steps) for the deadline while a task waits inside a call: its peers wait in a
collective for a task that never reaches it (a stuck input pipeline, a deadlock in a callback,
a dead link). Start-up and the first call's tracing are excluded (the deadline is armed once
every task has finished a call), and so is idle work: while any task is idle (an epoch's end:
evaluation, checkpoints, the user's `on_epoch_end`) the clock is paused. Pure: the supervisor
feeds it the time and the tasks' progress.

```python
watch = HangWatch(timeout=None)          # max(10 x the slowest call, 60 s)
hang = watch.observe(now, {"worker-0": progress_0, "worker-1": progress_1})
```
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping

import tfdist.progress as progress

FLOOR_S = 60.0
SLOWEST_CALLS = 10  # The derived deadline: this many times the slowest call so far.


@dataclasses.dataclass(frozen=True)
class Hang:
  """What the launcher names.

  Attributes:
    behind: the task that has not begun the call its peers wait in (with every task in a
      call, the first of them).
    waited: seconds without progress.
    call: the call (1-based) the peers wait in.
    epoch: the task behind's epoch (0-based).
    step: the steps of that epoch the task behind has done.
    every_task_waits: no task of these is behind: each waits in the call (a peer on another
      host, or a collective that never completes).
  """
  behind: str
  waited: float
  call: int
  epoch: int
  step: int
  every_task_waits: bool

  def describe(self) -> str:
    where = f"epoch {self.epoch + 1}, after step {self.step}"
    if self.every_task_waits:
      return (f"hang: every task here has waited in call {self.call} for {self.waited:.0f} s "
              f"({where}): a peer on another host never reached it, or its collective never "
              "completes")
    return (f"hang: {self.behind} has not begun call {self.call}, which its peers wait in, "
            f"for {self.waited:.0f} s ({where})")


class HangWatch:
  """The hang deadline over a cluster's training tasks.

  Args:
    timeout: seconds without progress; None derives it: max(SLOWEST_CALLS x the slowest call
      any task has finished, FLOOR_S).
  """

  def __init__(self, timeout: float | None = None):
    self.timeout = timeout
    self._seen: tuple = ()
    self._since: float | None = None

  def deadline(self, tasks: Mapping[str, dict]) -> float:
    if self.timeout is not None:
      return self.timeout
    slowest = max((float(p.get("slowest", 0)) for p in tasks.values()), default=0.0)
    return max(SLOWEST_CALLS * slowest, FLOOR_S)

  def observe(self, now: float, tasks: Mapping[str, dict | None]) -> Hang | None:
    """The hang, if `tasks` (each one's progress snapshot, None before its first beat) have
    made none for the deadline; else None."""
    known = {name: p for name, p in tasks.items() if p is not None}
    seen = tuple(sorted((n, p["begun"], p["finished"]) for n, p in known.items()))
    if seen != self._seen or self._since is None or not known or \
        any(p["phase"] == progress.IDLE for p in known.values()):
      self._seen, self._since = seen, now  # Progress, or the clock paused.
      return None
    armed = len(known) == len(tasks) and all(p["finished"] >= 1 for p in known.values())
    waiting = [n for n, p in known.items() if p["phase"] == progress.CALL]
    waited = now - self._since
    if not armed or not waiting or waited < self.deadline(known):
      return None
    call = max(p["begun"] for p in known.values())
    behind = min(known, key=lambda n: (known[n]["begun"], known[n]["phase"] == progress.CALL))
    every_task_waits = len(waiting) == len(known) and \
        all(p["begun"] == call for p in known.values())
    if every_task_waits:
      behind = sorted(waiting)[0]
    return Hang(behind, waited, call, int(known[behind]["epoch"]), int(known[behind]["step"]),
                every_task_waits)


_UNHEALTHY = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")
_COORDINATION_LOST = ("stopped sending heartbeats", "The tasks have crashed")


def lost_peers(log_tail: str, own: str) -> list[str]:
  """The peers TensorFlow's coordination service says were lost (no heartbeats: a host cut
  off, a process killed elsewhere), named as tasks (`worker-1`), from the end of task `own`'s
  log; empty when it says none. Pure.

  >>> lost_peers("... unhealthy (stopped sending heartbeats):\\n/job:worker/replica:0/task:1\\n"
  ...            "The tasks have crashed.", "worker-0")
  ['worker-1']
  """
  if not any(marker in log_tail for marker in _COORDINATION_LOST):
    return []
  at = max(log_tail.rfind(marker) for marker in _COORDINATION_LOST)
  window = log_tail[max(at - 2000, 0):at + 2000]
  names = dict.fromkeys(f"{job}-{index}" for job, index in _UNHEALTHY.findall(window))
  return [name for name in names if name != own]
