"""A kill -9 and what it costs: one local or Ray launch of tests/programs/resumable.py (2
workers, `--max-restarts 1`, epochs of 8 steps, 0.2 s a step) whose worker-1 dies after step 5
of epoch 3 (its process on the local backend; on Ray its actor, as when its node is lost):
seconds from the kill to the chief's first step after the restart, and the steps redone (done
at the kill less the step resumed at). `ray_head()` starts a Ray head on 127.0.0.1 for it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # Ray binds 127.0.0.1 only.


def kill9(every: int, ray_address: str | None = None,
          launch_flags: tuple[str, ...] = ()) -> tuple[float, int]:
  """(seconds from the kill to training again, steps redone) of one launch, backups every
  `every` steps (0: epoch ends); on the Ray head at `ray_address` when given; `launch_flags`
  given to `tfdist launch` (`("--preload", "off")`)."""
  with tempfile.TemporaryDirectory() as tmp:
    config = os.path.join(tmp, "config.yaml")
    with open(config, "w") as out:
      out.write("cluster: {worker: 2}\n"
                f"checkpoint: {{dir: {tmp}/checkpoints, backup_every_steps: {every}, backup_budget: null}}\n")
    env = {**os.environ, "PYTHONPATH": _REPO, "TF_CPP_MIN_LOG_LEVEL": "3", "STEP_LINES": "1",
           "TMPDIR": tmp, **LOOPBACK, **({"RAY_ADDRESS": ray_address} if ray_address else {})}
    backend = ["--backend", "ray"] if ray_address else []
    process = subprocess.Popen(
        [sys.executable, "-m", "tfdist", "launch", config, *backend, *launch_flags, "--logs",
         f"{tmp}/logs",
         "--max-restarts", "1", "--grace-period", "3", "--", sys.executable,
         os.path.join(_REPO, "tests", "programs", "resumable.py")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True)
    killed = resumed = pid = None
    try:
      for line in process.stdout:
        if pid is None and (started := re.search(r"worker-1 started \(pid (\d+)\)", line)):
          pid = int(started[1])
        elif killed is None and "[worker-0] STEP 2 5" in line:
          import psutil
          # Its process group's leader: the task itself; on Ray its actor, the task's parent.
          os.kill(psutil.Process(pid).ppid() if ray_address else pid, signal.SIGKILL)
          killed = time.monotonic()
        elif killed is not None and (found := re.search(r"resuming at epoch (\d+) of \d+"
                                                        r"(?:, step (\d+))?", line)):
          resumed = (int(found[1]) - 1, int(found[2] or 1) - 1)
        elif killed is not None and re.search(r"\[worker-0\] STEP \d+ \d+", line):
          seconds = time.monotonic() - killed
          done = 5 + 8 * 2  # Steps done at the kill: epochs 0 and 1, 5 of epoch 2.
          redone = done - (8 * resumed[0] + resumed[1]) if resumed else done
          return seconds, redone
      raise RuntimeError("the launch did not train again")
    finally:
      os.killpg(process.pid, signal.SIGTERM)  # The launcher removes its Ray actors and folders.
      try:
        process.wait(60)
      except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@contextlib.contextmanager
def ray_head(cpus: int = 4):
  """A Ray head on 127.0.0.1 (`ray start --head --block`), killed with its process group at
  the end; yields its address (RAY_ADDRESS)."""
  import portpicker
  from tfdist.machine.ports import accepts
  port = portpicker.pick_unused_port()
  temp = tempfile.mkdtemp(prefix="tfdist-ray-", dir="/tmp")  # Short: Ray's sockets live there.
  head = subprocess.Popen(
      ["ray", "start", "--head", "--block", f"--port={port}", f"--num-cpus={cpus}",
       "--include-dashboard=false", f"--temp-dir={temp}", "--disable-usage-stats"],
      env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **LOOPBACK},
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
  address = f"127.0.0.1:{port}"
  try:
    deadline = time.monotonic() + 90
    while not accepts(address):  # Its GCS; launches connect through it.
      if time.monotonic() > deadline or head.poll() is not None:
        raise RuntimeError("the Ray head did not come up in 90 s")
      time.sleep(1)
    yield address
  finally:
    os.killpg(head.pid, signal.SIGKILL)
    head.wait()
    shutil.rmtree(temp, ignore_errors=True)

