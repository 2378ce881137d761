"""The launcher's terminal: its own lines (`[tfdist launch] ...`), each task's output with the
task's prefix (and in its plain-text log), the transient reconnect lines counted instead of
shown, and quiet spells while stacks are written or a failure stops the rest."""

from __future__ import annotations

import collections
import re
import threading
import time
from typing import Callable, TextIO

from tfdist.launch import liveness
from tfdist.machine import banners

_TAIL_LINES = 20
# Lines a task repeats while a peer restarts; counted and summarised, still in the log file.
_NOISE = re.compile(rb"Connection refused|failed to connect to all addresses|UNAVAILABLE")


class Output:
  """Where a launch's lines go.

  Args:
    out: the terminal (or pipe, or file); None, or once it is closed, only the logs get output.
    on_say: also called with each of the launcher's own lines (TensorBoard's launcher events).
  """

  def __init__(self, out: TextIO | None, on_say: Callable[[str], None] | None = None):
    self.out, self.on_say = out, on_say
    self.terminal = bool(out is not None and getattr(out, "isatty", lambda: False)())
    self.noise: collections.Counter = collections.Counter()
    self.quiet_until = 0.0  # Task output is kept off the terminal until then.
    self._lock = threading.Lock()

  def say(self, line: str) -> None:
    """One of the launcher's own lines."""
    self.write(f"[tfdist launch] {line}\n")
    if self.on_say is not None:
      self.on_say(line)

  def write(self, text: str) -> None:
    with self._lock:
      if self.out is None:
        return
      try:
        self.out.write(text)
        self.out.flush()
      except (BrokenPipeError, OSError, ValueError):
        self.out = None  # The reader went away (`| head`): keep going, logging to files.

  def pump(self, name: str, stream, log_path: str, shown: bool,
           peer_failed: Callable[[], bool]) -> None:
    """Task `name`'s output lines into its log and, when `shown`, onto the terminal with its
    prefix (not while quiet, nor once a peer failed: the root-cause line says what
    happened)."""
    with open(log_path, "ab") as log:
      for raw in iter(stream.readline, b""):
        # The log, and any output but a terminal (a pipe, a file), get the line's last redraw
        # without colours: Keras's progress bar writes both whatever its output is.
        plain = liveness.plain_text(raw)
        log.write(plain.rstrip(b"\n") + b"\n" if raw.strip() else raw)
        log.flush()
        if banners.BANNERS.search(raw):  # Kept in the log file only.
          continue
        if _NOISE.search(raw):
          self.noise[name] += 1
          continue
        if shown and time.monotonic() >= self.quiet_until and not peer_failed():
          line = terminal_line(raw, name) if self.terminal else plain
          self.write(f"[{name}] " + line.decode(errors="replace"))


def terminal_line(raw: bytes, name: str) -> bytes:
  """`raw` for a terminal: each redraw of the line (a carriage return) keeps the task's
  prefix."""
  return re.sub(rb"\r(?!\n|$)", b"\r[" + name.encode() + b"] ", raw)


def tail(path: str, lines: int = _TAIL_LINES) -> str:
  """The last `lines` lines of the log at `path`, indented; a line saying so where it has
  none (a task dead of a signal before it wrote anything)."""
  count = lines
  try:
    with open(path, errors="replace") as f:
      lines = f.read().splitlines()[-count:] or ["(nothing: the task wrote no output)"]
  except OSError:
    lines = ["(no log)"]
  return "\n".join("    " + line for line in lines)
