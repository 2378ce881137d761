"""How the launcher tells a live task from a dead or frozen one: a heartbeat file each task
touches, plain-text logs (a task dies with the launcher: `tfdist.machine.children`).

```python
start_from_environment()             # in a task: touches $TFDIST_HEARTBEAT every second
age = heartbeat_age(path)            # in the launcher: seconds since the task's last beat
```
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import MutableMapping

HEARTBEAT_ENV = "TFDIST_HEARTBEAT"
"""The file a launched task touches every `BEAT_SECONDS` while its process runs."""
BEAT_SECONDS = 1.0
# Cursor moves, colours and the progress bar's carriage returns and backspaces.
_CONTROL = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|[\x08\x0d]")


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
