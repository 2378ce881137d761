"""Running `tfdist launch` from tests: start it, read its output until a line, finish it; the
launcher runs in its own process group, killed whole when a test gives up."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tests import bounds
from tests.conftest import REPO

ENV = {**os.environ, "PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"}


def running(pid):
  """Whether process `pid` runs: a zombie (dead, not yet reaped by a parent that is not the
  test's, e.g. a container's init that reaps nothing) does not."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(") ", 1)[1][0] != "Z"
  except FileNotFoundError:
    return False


def start_launch(*args, env=None):
  return subprocess.Popen([sys.executable, "-m", "tfdist", "launch", *args],
                          env={**ENV, **(env or {})}, cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True)


def read_until(process, pattern, timeout, seen):
  """Reads the launcher's output into `seen` until a line matches; returns the match."""
  bounds.check(timeout)
  deadline = time.monotonic() + timeout
  os.set_blocking(process.stdout.fileno(), False)
  while time.monotonic() < deadline:
    line = process.stdout.readline()
    if not line:
      if process.poll() is not None:
        break
      time.sleep(0.1)
      continue
    seen.append(line)
    match = re.search(pattern, line)
    if match:
      return match
  ended = process.poll()
  with contextlib.suppress(ProcessLookupError):  # It may have ended by itself: say so.
    os.killpg(process.pid, signal.SIGKILL)
  how = f"the launch ended with {ended} first" if ended is not None else f"in {timeout} s"
  pytest.fail(f"no {pattern!r}: {how}:\n{''.join(seen)[-3000:]}")


def finish(process, timeout, seen):
  os.set_blocking(process.stdout.fileno(), True)
  try:
    rest, _ = process.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.killpg(process.pid, signal.SIGKILL)
    raise
  return "".join(seen) + rest


MWMS_WITH_BACKUP = "cluster: {worker: 2}\ncheckpoint: {dir: %s}\n"


def run_launch(tmp_path, config_text, program, *args, flags=(), env=None):
  """(exit code, output) of a whole launch of tests/programs' `program` under `config_text`;
  a short grace period: a hung task never exits on SIGTERM."""
  (tmp_path / "config.yaml").write_text(config_text)
  process = subprocess.Popen(
      [sys.executable, "-m", "tfdist", "launch", str(tmp_path / "config.yaml"), "--logs",
       str(tmp_path / "logs"), "--grace-period", "3", *flags, "--", sys.executable,
       str(REPO / "tests" / "programs" / program), *args],
      env={**ENV, **(env or {})}, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True, start_new_session=True)
  try:
    output, _ = process.communicate(timeout=280)
  finally:
    if process.poll() is None:
      os.killpg(process.pid, signal.SIGKILL)
      process.wait()
  return process.returncode, output


def printed(stdout: str) -> dict[str, list[str]]:
  """{NAME: [each task's value]} of a program's `NAME value` lines ("[worker-0] " launched)."""
  found: dict[str, list[str]] = {}
  for words in map(str.split, stdout.splitlines()):
    if len(words) >= 2 and words[-2].isupper():
      found.setdefault(words[-2], []).append(words[-1])
  return found
