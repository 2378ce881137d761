"""Two jobs never share state by accident (issue 40): a run name of each job's own, and a
checkpoint folder held by one job at a time (a lease another live job is refused by, that a
relaunch takes over from a holder that is gone)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

import tfdist
from tfdist.launch.plan import new_run_name
from tfdist.training import lease
from tests.conftest import PROGRAMS
from tests.launching import ENV, finish, read_until, running
from tests.programs import custom_loop


def test_run_names_are_the_jobs_own():
  assert new_run_name({"SLURM_JOB_ID": "1041"}, 0, "a1b2c3") == "slurm-1041"  # Across requeues.
  assert new_run_name({"TFDIST_JOB_ID": "mnist-x7"}, 0, "a1b2c3") == "mnist-x7"  # Kubernetes.
  now = time.time()
  assert new_run_name({}, now, "a1b2c3") != new_run_name({}, now, "d4e5f6")  # One second.


def _config(directory, **environ):
  return tfdist.load_config({"checkpoint": {"dir": str(directory)}}, environ={})


@pytest.fixture
def live_process():
  process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    yield process
  finally:
    process.kill()
    process.wait()


def _write(directory, **record):
  directory.mkdir(exist_ok=True)
  (directory / lease.FILE).write_text(json.dumps(record))


def test_a_live_holder_refuses_another_job_in_one_line(tmp_path, live_process):
  import socket
  _write(tmp_path, job="cluster-0123", run="20261123-131843-a1b2c3", host=socket.gethostname(),
         pid=live_process.pid, heartbeat=time.time())
  with pytest.raises(tfdist.ConfigError) as refused:
    lease.hold(_config(tmp_path), environ={"TFDIST_RUN": "other"})
  message = str(refused.value)
  assert message.startswith(f"<dict>: checkpoint.dir: is held by another running job: run "
                            f"20261123-131843-a1b2c3 (host {socket.gethostname()}, pid "
                            f"{live_process.pid}, heartbeat 0 s ago); ")
  assert message.endswith(f"Received: '{tmp_path}'") and "\n" not in message


def test_a_holder_that_is_gone_is_taken_over(tmp_path, live_process):
  import socket
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                        capture_output=True, text=True).stdout.strip()
  _write(tmp_path, job="cluster-0123", run="crashed", host=socket.gethostname(), pid=int(dead),
         heartbeat=time.time())
  held = lease.hold(_config(tmp_path), environ={"TFDIST_RUN": "relaunch"})
  try:
    assert json.loads((tmp_path / lease.FILE).read_text())["run"] == "relaunch"
  finally:
    held.release()
  assert not (tmp_path / lease.FILE).exists()
  # Another host's holder whose heartbeat stopped (a host lost, a job preempted elsewhere).
  _write(tmp_path, job="cluster-0123", run="lost", host="elsewhere", pid=live_process.pid,
         heartbeat=time.time() - lease.STALE_S - 1)
  held = lease.hold(_config(tmp_path), environ={"TFDIST_RUN": "relaunch"})
  held.release()


def test_a_holder_killed_but_not_yet_reaped_is_gone(tmp_path):
  """A task killed -9 whose parent died too waits, a zombie, for an init to reap it (this
  container's took 1-2 s): the kernel still answers `kill(pid, 0)` for it, yet it holds
  nothing (seen: a relaunch within a second of a kill -9 was refused)."""
  import socket
  zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # Not reaped until `wait`.
  try:
    deadline = time.monotonic() + 30
    while running(zombie.pid):  # Until it ends, a zombie.
      assert time.monotonic() < deadline, "the child never ended"
      time.sleep(0.05)
    os.kill(zombie.pid, 0)  # The kernel's answer: it exists.
    _write(tmp_path, job="cluster-0123", run="killed", host=socket.gethostname(),
           pid=zombie.pid, heartbeat=time.time())
    held = lease.hold(_config(tmp_path), environ={"TFDIST_RUN": "relaunch"})
    held.release()
  finally:
    zombie.wait()


def _launch(cwd, config, out, *, env=None, logs=None):
  return subprocess.Popen(
      [sys.executable, "-m", "tfdist", "launch", str(config),
       *(["--logs", str(logs)] if logs else []), "--", sys.executable,
       str(PROGRAMS / "custom_loop.py"), str(out), "reduce_mean"],
      env={**ENV, **(env or {})}, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True, start_new_session=True)


def _kill(*processes):
  for process in processes:
    if process.poll() is None:
      os.killpg(process.pid, signal.SIGKILL)
      process.wait()


CONFIG = ("cluster: {worker: 2}\ntraining: {global_batch_size: 32, mixed_precision: 'off', "
          "steps_per_execution: 2}\ncheckpoint: {dir: %s}\n")


def test_two_launches_of_one_config_in_one_folder_one_is_refused(tmp_path):
  config = tmp_path / "config.yaml"
  config.write_text(CONFIG % (tmp_path / "checkpoints"))
  first = _launch(tmp_path, config, tmp_path / "out1", env={"PAUSE_AT": "1:1"})
  second = None
  try:
    read_until(first, r"PAUSED", 180, [])  # It holds the folder, training.
    second = _launch(tmp_path, config, tmp_path / "out2")
    output = finish(second, 180, [])
    assert second.returncode not in (0, 42), output[-3000:]
    assert "checkpoint.dir: is held by another running job: run " in output, output[-3000:]
    (tmp_path / "out1" / "go").touch()
    assert finish(first, 180, []) and first.returncode == 0
  finally:
    _kill(first, *([second] if second else []))
  runs = sorted(os.listdir(tmp_path / "tfdist-logs"))
  assert len(runs) == 2 and runs[0] != runs[1], runs  # Each launch its own run and logs.
  assert not (tmp_path / "checkpoints" / lease.FILE).exists()  # Released at the end.


def test_a_killed_holders_lease_is_taken_over_by_the_relaunch_which_resumes(tmp_path):
  config = tmp_path / "config.yaml"
  config.write_text(CONFIG % (tmp_path / "checkpoints"))
  first = _launch(tmp_path, config, tmp_path / "out", env={"PAUSE_AT": "3:1"},
                  logs=tmp_path / "logs1")
  try:
    read_until(first, r"PAUSED", 180, [])
  finally:
    _kill(first)  # SIGKILL to every process: the lease stays behind, its holder dead.
  assert (tmp_path / "checkpoints" / lease.FILE).exists()
  second = _launch(tmp_path, config, tmp_path / "out", logs=tmp_path / "logs2")
  try:
    output = finish(second, 240, [])
  finally:
    _kill(second)
  assert second.returncode == 0, output[-3000:]
  assert "tfdist: resuming at epoch 3, step 16 from" in output, output[-3000:]
  custom_loop.assert_one_devices_weights(tmp_path / "out" / "result.npz")
