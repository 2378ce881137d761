"""Whether a server task should stop, from probes of its chief's port: the servers of a
cluster (a parameter-server cluster's workers and ps, the tf.data service's dispatcher and data
workers) end once the chief they served has come and gone (`ChiefWatch`, pure;
`until_chief_gone`, its probe loop)."""

from __future__ import annotations

import dataclasses
import threading
import time

from tfdist.machine.ports import accepts

CHIEF_GONE_SECONDS = 30.0
"""A server ends (exit 0) once the chief it served has been unreachable this long: the job is
done (or its chief failed, which its own launcher reports), so every engine sees the job end."""
MISSED_AFTER_NOTICE = 3
"""After a preemption notice, a server ends once this many probes in a row (a second apart)
missed its chief: one probe can miss a live chief (a 0.2 s connect to a busy chief's loopback
port timed out, then the next connected, on a 2-vCPU VM), and the chief is still saving from
this server's variables."""


@dataclasses.dataclass
class ChiefWatch:
  """Whether a server should stop, from probes of its chief's port. Pure.

  ```python
  watch = ChiefWatch("127.0.0.1:2222")
  watch.probed(True, stopping=False, now=0.0)    # None: serve on
  ```
  """
  chief: str
  gone_seconds: float = CHIEF_GONE_SECONDS
  seen: bool = False
  missed: int = 0
  gone_since: float | None = None

  def probed(self, reachable: bool, stopping: bool, now: float) -> str | None:
    """Takes one probe's result; returns why to stop, or None to serve on."""
    if reachable:
      self.seen, self.missed, self.gone_since = True, 0, None
      return None
    self.missed += 1
    if stopping and self.missed >= MISSED_AFTER_NOTICE:
      return f"the chief at {self.chief} is gone: stopping"
    if self.seen:
      self.gone_since = now if self.gone_since is None else self.gone_since
      if now - self.gone_since >= self.gone_seconds:
        return (f"the chief at {self.chief} is gone for {self.gone_seconds:g} s: the job is "
                "done; stopping")
    return None


def until_chief_gone(chief: str, gone_seconds: float = CHIEF_GONE_SECONDS,
                     stopping: threading.Event | None = None) -> str:
  """Probes `chief`'s port once a second until `ChiefWatch` says to stop; returns why.

  Args:
    chief: the chief's host:port.
    gone_seconds: how long the chief may be unreachable, once seen, before the job is done.
    stopping: set when a preemption notice arrived (then three missed probes in a row end it).
  """
  watch = ChiefWatch(chief, gone_seconds)
  stopping = stopping or threading.Event()
  while True:
    if stopping.is_set():
      time.sleep(1.0)  # A probe a second, as before the notice.
    else:
      stopping.wait(1.0)
    why = watch.probed(accepts(watch.chief), stopping.is_set(), time.monotonic())
    if why:
      return why
