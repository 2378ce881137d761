"""How tfdist starts a child process (a launched task, TensorBoard): it dies with its parent
and starts with no signal blocked. Below every room that starts processes."""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1


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


def alive(pid: int) -> bool:
  """Whether process `pid` of this host is alive (one of another user's counts as alive; a
  zombie, dead but not yet reaped by its parent, does not: a container's init may take its
  time to reap an orphan killed -9)."""
  if pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(") ", 1)[1][:1] != "Z"
  except (OSError, IndexError):
    return True  # No /proc: what kill(0) said.
