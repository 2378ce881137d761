"""How the launcher tells a live task from a dead or frozen one, and keeps tasks from outliving
it: a parent-death signal for each task, a heartbeat file each task touches, plain-text logs.

```python
start_from_environment()             # in a task: touches $TFDIST_HEARTBEAT every second
age = heartbeat_age(path)            # in the launcher: seconds since the task's last beat
```
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import threading
import time
from typing import MutableMapping

HEARTBEAT_ENV = "TFDIST_HEARTBEAT"
"""The file a launched task touches every `BEAT_SECONDS` while its process runs."""
BEAT_SECONDS = 1.0
_PR_SET_PDEATHSIG = 1
# Cursor moves, colours and the progress bar's carriage returns and backspaces.
_CONTROL = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|[\x08\x0d]")


def die_with_parent() -> None:
  """Asks Linux to SIGKILL this process when its parent dies (a `preexec_fn`): a task never
  outlives a launcher killed by any means, SIGKILL included. SIGKILL because
  MultiWorkerMirrored tasks catch and ignore SIGTERM."""
  with_libc = ctypes.CDLL(None, use_errno=True)
  with_libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def start_as_child() -> None:
  """The `preexec_fn` of every process tfdist starts: it dies with its parent
  (`die_with_parent`) and starts with no signal blocked. A child inherits its parent's signal
  mask, and a parent blocking the stop signals to `sigwait` them (`tfdist tensorboard`) passed
  them on: TensorBoard ignored the SIGTERM meant to stop it and was killed 10 s later."""
  die_with_parent()
  signal.pthread_sigmask(signal.SIG_SETMASK, [])


def plain_text(raw: bytes) -> bytes:
  """A line of task output without terminal control sequences, for the log file."""
  return _CONTROL.sub(b"", raw)


def start_from_environment(environ: MutableMapping[str, str] = os.environ) -> bool:
  """Starts a daemon thread touching `$TFDIST_HEARTBEAT` (removed from the environment, so the
  task's own child processes do not beat for it); returns whether it started.

  The thread stops only when the whole process does (SIGSTOP, a debugger, swapped out): that
  is the freeze the launcher names."""
  path = environ.pop(HEARTBEAT_ENV, None)
  if not path:
    return False

  def beat():
    while True:
      try:
        os.utime(path)
      except FileNotFoundError:
        open(path, "a").close()
      except OSError:
        return
      time.sleep(BEAT_SECONDS)
  threading.Thread(target=beat, name="tfdist-heartbeat", daemon=True).start()
  return True


def heartbeat_age(path: str, now: float | None = None) -> float | None:
  """Seconds since the task last touched `path`; None when it never has (it does not beat)."""
  try:
    return (time.time() if now is None else now) - os.stat(path).st_mtime
  except OSError:
    return None
