"""`tfdist export slurm`'s scripts on a real Slurm (slurm-wlm's slurmctld and slurmd on
127.0.0.1, started and stopped by `tests/integration/slurm/run`): a MultiWorkerMirrored job, a
parameter-server job that ends by itself, a failing task's exit code, two jobs on one node, one
config submitted twice, a preempted job requeued and resumed. Skipped, with the reason, where
slurm-wlm is not installed or the suite does not run as root (the daemons need it)."""

import os
import re
import shutil
import subprocess

import pytest

from tests.conftest import REPO
from tests.launching import ENV


@pytest.mark.skipif(shutil.which("slurmctld") is None,
                    reason="slurm-wlm is not installed (`bash tests/integration/slurm/run` "
                           "installs it with apt-get)")
@pytest.mark.skipif(os.geteuid() != 0, reason="slurmctld and slurmd are started as root")
@pytest.mark.timeout(900)
def test_exported_jobs_run_on_a_real_slurm():
  done = subprocess.run(["bash", str(REPO / "tests" / "integration" / "slurm" / "run")],
                        cwd=REPO, env=ENV, capture_output=True, text=True, timeout=880)
  summary = re.search(r"^(\d+) passed, (\d+) failed$", done.stdout, re.M)
  assert done.returncode == 0 and summary and summary.group(2) == "0", \
      done.stdout[-4000:] + done.stderr[-2000:]
