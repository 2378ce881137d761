"""Programs a test starts, started as a suite's launches start their tasks: forked from the
suite's shared preloaded TensorFlow (`tfdist.machine.preload.Shared`, named by the environment's
`TFDIST_PRELOAD_SERVER`) where it may fork them, else as their own processes. A forked program
is the program a fresh interpreter runs (`preload`'s text says how), without the 4-5 CPU-s of
importing TensorFlow and the 1-2 of its teardown (tfdist's suite ran 123 such imports outside
its launches, 2026-11-28).

Either way the program runs in a session of its own (`os.killpg(p.pid, SIGKILL)` ends it and
its children) with no input, and its process has Popen's `pid`, `poll`, `wait`, `returncode`,
`send_signal` and `kill`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import threading
from typing import Mapping, Sequence

from tfdist.machine import preload

_CLIENTS: dict[str, preload.Preloaded] = {}  # One connection per shared server and process.
_LOCK = threading.Lock()


def popen(argv: Sequence[str], env: Mapping[str, str], *, stdout: int, stderr: int | None = None,
          cwd: str | os.PathLike | None = None):
  """Starts `argv`, forked where it may be.

  Args:
    argv: the command (`python SCRIPT ...` or `python -m MODULE ...` may be forked).
    env: its whole environment.
    stdout: a file descriptor for its output.
    stderr: one for its errors; None: its output's.
    cwd: its working directory; None: this process's.

  Returns:
    A `subprocess.Popen`, or a `preload.ForkedTask` with the same surface.

  Example:

  ```python
  with open("task.log", "wb") as log:
    process = forked.popen([sys.executable, "train.py"], os.environ, stdout=log.fileno())
  process.wait()
  ```
  """
  env = dict(env)
  cwd = None if cwd is None else os.fspath(cwd)
  shared = env.get(preload.SHARED_ENV)
  if shared:
    with _LOCK:
      if shared not in _CLIENTS:
        _CLIENTS[shared] = preload.Preloaded()
      client = _CLIENTS[shared]
    task = client.start(argv, env, cwd, stdout=stdout, stderr=stderr, own_server=False)
    if task is not None:
      return task
  return subprocess.Popen(list(argv), env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=stdout,
                          stderr=subprocess.STDOUT if stderr is None else stderr,
                          start_new_session=True)


def run(argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float,
        cwd: str | os.PathLike | None = None) -> subprocess.CompletedProcess:
  """Runs `argv` to its end (forked where it may be), its output and errors kept apart, as
  `subprocess.run(argv, capture_output=True, text=True, timeout=timeout)`.

  Args:
    argv: the command.
    env: its whole environment; None: this process's.
    timeout: seconds; past them its session is killed and `subprocess.TimeoutExpired` raised.
    cwd: its working directory; None: this process's.

  Returns:
    A `subprocess.CompletedProcess` with `returncode`, `stdout` and `stderr` (text).

  Example:

  ```python
  done = forked.run([sys.executable, "-m", "tfdist", "estimate", "config.yaml"], timeout=120)
  assert done.returncode == 0, done.stderr
  ```
  """
  with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
    process = popen(argv, os.environ if env is None else env, stdout=out.fileno(),
                    stderr=err.fileno(), cwd=cwd)
    try:
      code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
      process.wait()
      raise
    texts = []
    for f in (out, err):
      f.seek(0)
      texts.append(f.read().decode(errors="replace"))
  return subprocess.CompletedProcess(list(argv), code, *texts)
