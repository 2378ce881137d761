"""`tfdist export slurm`'s scripts on a real Slurm (slurm-wlm's slurmctld and slurmd on
127.0.0.1, started and stopped by `tests/integration/slurm/run`): a MultiWorkerMirrored job, a
parameter-server job that ends by itself, a failing task's exit code, two jobs on one node, one
config submitted twice, a preempted job requeued and resumed. Skipped, with the reason, where
slurm-wlm is not installed or the suite does not run as root (the daemons need it).

The script's jobs mostly wait on Slurm (its scheduler, a requeued job's credential hold), so
the suite starts it as soon as collection selects this test (`conftest.py`) and the test waits
for it: its two minutes run beside the other tests, with none of the suite's process mark (its
daemons and jobs are its own, stopped by its own clean-up or by `stop` at the session's end)."""

import os
import re
import shutil
import signal
import subprocess
import tempfile

import pytest

from tests.conftest import REPO
from tests.launching import ENV

_RUNS_S = 880
_started = {}


def runs_here() -> bool:
  return shutil.which("slurmctld") is not None and os.geteuid() == 0


def start() -> None:
  """Starts the script in a session of its own, its output to a file, once."""
  if _started:
    return
  env = {k: v for k, v in ENV.items() if k != "TFDIST_TEST_SESSION"}
  output = tempfile.NamedTemporaryFile("w+", prefix="tfdist-slurm-run-", suffix=".log",
                                       delete=False)
  process = subprocess.Popen(["bash", str(REPO / "tests" / "integration" / "slurm" / "run")],
                             cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
  _started.update(process=process, output=output)


def stop() -> None:
  """Ends the script if it still runs: SIGTERM to its group (its clean-up stops the daemons),
  then SIGKILL."""
  process = _started.get("process")
  if process is None or process.poll() is not None:
    return
  os.killpg(process.pid, signal.SIGTERM)
  try:
    process.wait(timeout=15)
  except subprocess.TimeoutExpired:
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@pytest.mark.skipif(shutil.which("slurmctld") is None,
                    reason="slurm-wlm is not installed (`bash tests/integration/slurm/run` "
                           "installs it with apt-get)")
@pytest.mark.skipif(os.geteuid() != 0, reason="slurmctld and slurmd are started as root")
@pytest.mark.timeout(900)
def test_exported_jobs_run_on_a_real_slurm():
  start()  # Already started by the session, unless this test was run alone.
  process, output = _started["process"], _started["output"]
  try:
    process.wait(timeout=_RUNS_S)
  finally:
    stop()
  output.seek(0)
  stdout = output.read()
  summary = re.search(r"^(\d+) passed, (\d+) failed$", stdout, re.M)
  assert process.returncode == 0 and summary and summary.group(2) == "0", stdout[-6000:]
  os.unlink(output.name)  # Kept for a failure's reader only.
