"""The real-Slurm script (`tests/integration/slurm/run`) as a background run of the suite:
started once per test run by whichever process learns first that its test is selected, found
by the test's process through a state file named by the run (its process group, output and
exit code files), stopped at the session's end. See tests/test_real_slurm.py."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import tempfile
import time

import psutil

REPO = pathlib.Path(__file__).resolve().parent.parent
TEST_ID = "tests/test_real_slurm.py::test_exported_jobs_run_on_a_real_slurm"


def runs_here() -> bool:
  return shutil.which("slurmctld") is not None and os.geteuid() == 0


def _state_file(run: str) -> pathlib.Path:
  return pathlib.Path(tempfile.gettempdir()) / f"tfdist-slurm-run-{run}.json"


def start(run: str) -> dict:
  """Starts the script in a session of its own, its output and then its exit code to files,
  once per `run` (pytest-xdist's test run id, or the one test process's id); returns its
  state: `group` (its process group), `output` and `rc` (the files)."""
  state_file = _state_file(run)
  if state_file.exists():
    return json.loads(state_file.read_text())
  # Without the suite's process mark: the daemons and jobs are the script's own to stop.
  env = {k: v for k, v in os.environ.items() if k != "TFDIST_TEST_SESSION"}
  env.update(PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2")
  with tempfile.NamedTemporaryFile("w", prefix="tfdist-slurm-run-", suffix=".log",
                                   delete=False) as output:
    process = subprocess.Popen(
        ["bash", "-c", 'bash "$0"; echo $? > "$1"',
         str(REPO / "tests" / "integration" / "slurm" / "run"), output.name + ".rc"],
        cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
  state = {"group": process.pid, "output": output.name, "rc": output.name + ".rc"}
  state_file.write_text(json.dumps(state))
  return state


def alive(group: int) -> bool:
  """Whether a process of `group` still runs. A zombie does not: the script's wrapper, once
  ended, stays one until the process that started it (not always this one) reaps it."""
  for process in psutil.process_iter(["status"]):
    try:
      if process.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(process.pid) == group:
        return True
    except (ProcessLookupError, psutil.Error):
      pass
  return False


def stop(run: str) -> None:
  """Ends the script if it still runs: SIGTERM to its group (its clean-up stops the daemons),
  SIGKILL to what is left 15 s later; forgets the run."""
  state_file = _state_file(run)
  if not state_file.exists():
    return
  group = json.loads(state_file.read_text())["group"]
  state_file.unlink()
  for signum, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 0)):
    if not alive(group):
      return
    os.killpg(group, signum)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and alive(group):
      time.sleep(0.2)
