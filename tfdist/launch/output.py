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
_TRACEBACK = b"Traceback (most recent call last):"
HELD_S = 2.0
"""How long a task's traceback waits off the terminal for the task's output to end: a dying
task's ends within milliseconds (its teardown writes nothing more); one that lives on (a
traceback it printed and went on after) is shown when its next line comes after this."""
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
           peer_failed: Callable[[], bool],
           exit_code: Callable[[], int | None] | None = None) -> None:
    """Task `name`'s output lines into its log and, when `shown`, onto the terminal with its
    prefix (not while quiet, nor once a peer failed: the root-cause line says what
    happened). A traceback the task writes as it dies (its output ends within `HELD_S` of it,
    `exit_code` then not 0) is kept to its log: the launcher's line naming the root cause
    shows the log's end, or names the lost peer whose loss it is (no survivor's collective
    error on the terminal); a traceback the task lives on after is shown."""
    held: list[tuple[bytes, bytes]] = []  # A traceback's lines, as (raw, plain), since `began`.
    began = 0.0

    def show(raw: bytes, plain: bytes) -> None:
      if shown and time.monotonic() >= self.quiet_until and not peer_failed():
        line = terminal_line(raw, name) if self.terminal else plain
        self.write(f"[{name}] " + line.decode(errors="replace"))

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
        if held and time.monotonic() - began > HELD_S:  # It lived on: shown after all.
          for line in held:
            show(*line)
          held = []
        if held or (exit_code is not None and plain.startswith(_TRACEBACK)):
          began = began if held else time.monotonic()
          held.append((raw, plain))
          continue
        show(raw, plain)
    if held and exit_code is not None and exit_code() in (0, None):
      for line in held:
        show(*line)


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
