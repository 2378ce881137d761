"""How the launcher tells a live task from a dead or frozen one: a heartbeat file each task
touches, plain-text logs (a task dies with the launcher: `tfdist.machine.children`).

```python
start_from_environment()             # in a task: writes its progress to $TFDIST_HEARTBEAT
                                     # every second
age = heartbeat_age(path)            # in the launcher: seconds since the task's last beat
```
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import signal
import threading
import time
from typing import MutableMapping

import tfdist.progress as progress

HEARTBEAT_ENV = "TFDIST_HEARTBEAT"
"""The file a launched task touches every `BEAT_SECONDS` while its process runs."""
BEAT_SECONDS = 1.0
STACKS_SIGNAL = signal.SIGQUIT
"""Makes a launched task write every thread's Python stack to its log (faulthandler): the JVM's
thread-dump signal, never forwarded as a stop or preemption notice."""
# Cursor moves, colours and the progress bar's carriage returns and backspaces.
_CONTROL = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|[\x08\x0d]")


def last_redraw(raw: bytes) -> bytes:
  """A line of task output as a terminal leaves it: only the last redraw after a carriage
  return that shows something (Keras's progress bar redraws its whole line at each update,
  padded to the longest). Pure.

  >>> last_redraw(b"\\r 8/16 loss: 0.31\\r16/16 loss: 0.28\\n")
  b'16/16 loss: 0.28\\n'
  """
  body, newline = (raw[:-1], b"\n") if raw.endswith(b"\n") else (raw, b"")
  shown = [part for part in body.split(b"\r") if _CONTROL.sub(b"", part).strip()]
  return (shown[-1] if shown else body) + newline


def plain_text(raw: bytes) -> bytes:
  """A line of task output for the log file: its last redraw, without terminal control
  sequences (colours, cursor moves)."""
  return _CONTROL.sub(b"", last_redraw(raw))


def start_from_environment(environ: MutableMapping[str, str] = os.environ) -> bool:
  """Starts a daemon thread touching `$TFDIST_HEARTBEAT` (removed from the environment, so the
  task's own child processes do not beat for it); returns whether it started.

  The thread stops only when the whole process does (SIGSTOP, a debugger, swapped out): that
  is the freeze the launcher names."""
  path = environ.pop(HEARTBEAT_ENV, None)
  if not path:
    return False

  # The launcher's hang deadline asks every task for its Python stacks with STACKS_SIGNAL; a
  # task dying of a signal (SIGSEGV inside TensorFlow) leaves its stacks in its log too.
  faulthandler.register(STACKS_SIGNAL, all_threads=True, chain=False)
  faulthandler.enable(all_threads=True)

  def beat():
    while _write_beat(path):
      time.sleep(BEAT_SECONDS)
  progress.watch()
  progress.before_holding_the_gil(lambda: _write_beat(path))
  threading.Thread(target=beat, name="tfdist-heartbeat", daemon=True).start()
  return True


def _write_beat(path: str) -> bool:
  """Writes `progress.snapshot()` to `path`, whole (the launcher may read it at any moment);
  False once it cannot (the logs removed). Two threads call it (the heartbeat's, and one about
  to wait holding the GIL): one at a time, so the newer snapshot is the one left."""
  with _WRITING:
    try:
      with open(f"{path}.next", "w") as out:
        json.dump(progress.snapshot(), out)
      os.replace(f"{path}.next", path)
    except OSError:
      return False
  return True


_WRITING = threading.Lock()


def read_progress(path: str) -> dict | None:
  """The progress a task's heartbeat file holds (`tfdist.progress.snapshot`), or None."""
  try:
    with open(path) as beat:
      return json.load(beat)
  except (OSError, ValueError):
    return None


def heartbeat_age(path: str, now: float | None = None) -> float | None:
  """Seconds since the task last touched `path`; None when it never has (it does not beat)."""
  try:
    return (time.time() if now is None else now) - os.stat(path).st_mtime
  except OSError:
    return None
