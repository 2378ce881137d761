"""When a step backup is taken: at multiples of `checkpoint.backup_every_steps` steps into an
epoch, skipped while the last backup cost more than `checkpoint.backup_budget` of the time since
it began (CheckFreq's rule, Mohan et al., FAST '21: a checkpoint's cost kept a share of the run).

A backup's cost is the time the steps waited for its copy plus the time its background write
took (on a 2-core machine the write takes a core from the steps: measured, one backup slowed the
steps by about its copy and write together). A model whose steps are short backs up less often
than `backup_every_steps`, and a kill -9 then redoes more steps: `backup_budget: null` keeps
every multiple whatever it costs.

Every MultiWorkerMirrored worker must back up at the same step (a sharded optimizer's backup
gathers the shards), and each measures its own costs: at a due step the workers vote, and back
up only when every one of them can afford it.

```python
cadence = Cadence(every=100, budget=0.03)
if cadence.due(before=steps_before_the_call, done=steps_done):
  started = cadence.begin()
  ...                                    # the copy
  cadence.waited(started)                # the steps go on
  ...                                    # the write, in the background
  cadence.wrote(seconds)
```
"""

from __future__ import annotations

import math
import time
from typing import Callable


class Cadence:
  """The step backups' schedule of one fit or loop.

  Args:
    every: backups at multiples of this many steps into an epoch (0: none within epochs).
    budget: the largest share of the time since a backup began that it may cost before the next
      is taken (None: every multiple).
    vote: under MultiWorkerMirrored, `agreement.Vote.every` (whether every worker can afford
      the backup); None for one process.
    clock: seconds, monotonic (a test's own).
  """

  def __init__(self, every: int, budget: float | None, *, vote: Callable[[bool], bool] | None
               = None, clock: Callable[[], float] = time.monotonic):
    self.every, self.budget = every, budget
    self._vote, self._clock = vote, clock
    self._began: float | None = None  # When the last backup began.
    self._copy: float | None = None  # The steps' wait for its copy (None: not yet back).
    self._write: float | None = None  # Its write (None: still writing).
    self.skipped = 0  # Due backups not taken for their cost.
    self._said = False
    self._here = True  # Whether this worker could afford the last one due.

  def due(self, before: int, done: int) -> bool:
    """Whether to back up once a call took the epoch's steps from `before` to `done`: it
    crossed a multiple of `every`, and (with a budget) every worker can afford it. Every worker
    asks at the same calls (the vote is a collective)."""
    if not self.every or done // self.every == before // self.every:
      return False
    if self.budget is None:
      return True
    self._here = self.affordable()
    due = self._here if self._vote is None else self._vote(self._here)
    self.skipped += not due
    return due

  def skip_line(self, where: str) -> str | None:
    """What to say when the backup due `where` ("epoch 2, step 300") was the first skipped;
    None otherwise."""
    if self.skipped != 1 or self._said:
      return None
    self._said = True
    if self._here:  # This worker could: a peer could not.
      return (f"tfdist: step backups: the one due at {where} is skipped: another worker's last "
              f"cost more than {self.budget:.0%} of the time since it began "
              "(checkpoint.backup_budget); the next is taken once every worker can afford it")
    cost = self.cost()
    spent = "is still being written" if math.isinf(cost) else f"cost {cost:.2f} s"
    return (f"tfdist: step backups: the one due at {where} is skipped: the last {spent}, over "
            f"{self.budget:.0%} of the {self.since():.1f} s since it began "
            "(checkpoint.backup_budget); the next is taken once affordable")

  def cost(self) -> float:
    """The last backup's cost in seconds: its copy and its write (inf while it writes)."""
    if self._began is None:
      return 0.0
    if self._copy is None or self._write is None:
      return math.inf
    return self._copy + self._write

  def since(self) -> float:
    """Seconds since the last backup began."""
    return 0.0 if self._began is None else self._clock() - self._began

  def affordable(self) -> bool:
    """Whether the last backup cost at most `budget` of the time since it began (a write
    still going on never does)."""
    return self._began is None or self.cost() <= self.budget * self.since()

  def begin(self) -> float:
    """A backup begins (its copy, in the step); returns the time, for `waited`."""
    self._began, self._copy, self._write = self._clock(), None, None
    return self._began

  def waited(self, began: float) -> None:
    """The steps go on again: the copy took the time since `began`."""
    self._copy = self._clock() - began

  def wrote(self, seconds: float) -> None:
    """The backup's write took `seconds` (the writing thread calls it; a backup written in the
    step calls it too, with its write's time)."""
    self._write = seconds
