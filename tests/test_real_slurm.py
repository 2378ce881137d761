"""`tfdist export slurm`'s scripts on a real Slurm (slurm-wlm's slurmctld and slurmd on
127.0.0.1, started and stopped by `tests/integration/slurm/run`): a MultiWorkerMirrored job, a
parameter-server job that ends by itself, a failing task's exit code, two jobs on one node, one
config submitted twice, a preempted job requeued and resumed, a job with the tf.data service's
roles. Skipped, with the reason, where
slurm-wlm is not installed or the suite does not run as root (the daemons need it).

The script's jobs mostly wait on Slurm (its scheduler, a requeued job's credential hold), so
the session starts it as soon as it knows this test is selected (`conftest.py`; under
pytest-xdist the controller does, since the workers would reach this one-test file last) and
the test waits for it: its minutes run beside the other tests (`tests/slurm_run.py`)."""

import os
import pathlib
import re
import shutil
import time

import pytest

from tests import slurm_run

_RUNS_S = 880


@pytest.mark.skipif(shutil.which("slurmctld") is None,
                    reason="slurm-wlm is not installed (`bash tests/integration/slurm/run` "
                           "installs it with apt-get)")
@pytest.mark.skipif(os.geteuid() != 0, reason="slurmctld and slurmd are started as root")
@pytest.mark.timeout(900)
def test_exported_jobs_run_on_a_real_slurm():
  run = os.environ.get("PYTEST_XDIST_TESTRUNUID", str(os.getpid()))
  state = slurm_run.start(run)  # Already started by the session, unless run by itself.
  rc_file = pathlib.Path(state["rc"])
  deadline = time.monotonic() + _RUNS_S
  try:
    while not rc_file.exists() and time.monotonic() < deadline and \
        slurm_run.alive(state["group"]):
      time.sleep(1)
  finally:
    slurm_run.stop(run)
  stdout = pathlib.Path(state["output"]).read_text()
  returncode = rc_file.read_text().strip() if rc_file.exists() else "none (stopped)"
  summary = re.search(r"^(\d+) passed, (\d+) failed$", stdout, re.M)
  assert returncode == "0" and summary and summary.group(2) == "0", \
      f"exit code {returncode}\n{stdout[-6000:]}"
  os.unlink(state["output"])  # Kept for a failure's reader only.
  rc_file.unlink()
