"""A hung cluster is named, its stacks kept, and it is restarted (issue 41): the hang deadline's
rules as data (`launch/hangs.py`), then real launches: a worker blocked in a callback (under
`tfdist.fit`) or in its own loop (`tfdist.TrainingLoop`) is named within the deadline, its stack
is in its log, and the restarted run ends with an uninterrupted run's weights; a slow but
progressing run and a slow `on_epoch_end` are never named."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from tfdist import progress
from tfdist.launch.hangs import HangWatch
from tests.conftest import PROGRAMS, REPO
from tests.launching import ENV
from tests.programs import custom_loop, resumable

pytestmark = pytest.mark.usefixtures("two_cpus")  # In-process references: the suite's devices.


def _p(begun, finished, phase, slowest=0.5, epoch=1, step=3):
  return {"begun": begun, "finished": finished, "phase": phase, "slowest": slowest,
          "epoch": epoch, "step": step}


def test_the_task_that_has_not_begun_the_call_its_peers_wait_in_is_named():
  watch = HangWatch(timeout=10)
  tasks = {"worker-0": _p(8, 7, progress.CALL), "worker-1": _p(7, 7, progress.BETWEEN)}
  assert watch.observe(0, tasks) is None
  assert watch.observe(9, tasks) is None
  hang = watch.observe(11, tasks)
  assert (hang.behind, hang.call, hang.every_task_waits) == ("worker-1", 8, False)
  assert hang.describe() == ("hang: worker-1 has not begun call 8, which its peers wait in, "
                             "for 11 s (epoch 2, after step 3)")


def test_progress_idle_and_the_first_call_keep_the_clock_from_running():
  watch = HangWatch(timeout=10)
  moving = [{"worker-0": _p(n, n - 1, progress.CALL), "worker-1": _p(n, n - 1, progress.CALL)}
            for n in range(1, 30)]
  assert all(watch.observe(5 * i, tasks) is None for i, tasks in enumerate(moving))  # Slow.
  idle = {"worker-0": _p(30, 30, progress.IDLE), "worker-1": _p(31, 30, progress.CALL)}
  assert watch.observe(200, idle) is None and watch.observe(900, idle) is None  # Epoch's end.
  tracing = HangWatch(timeout=10)
  first = {"worker-0": _p(1, 0, progress.CALL), "worker-1": _p(1, 0, progress.CALL)}
  assert tracing.observe(0, first) is None and tracing.observe(100, first) is None
  waiting = {"worker-0": _p(5, 4, progress.CALL)}  # A peer on another host: not seen here.
  hang = tracing.observe(200, waiting) or tracing.observe(300, waiting)
  assert hang.every_task_waits and "every task here has waited in call 5" in hang.describe()


def test_the_derived_deadline_is_ten_slowest_calls_with_a_floor():
  watch = HangWatch()
  assert watch.deadline({"w": _p(3, 3, progress.CALL, slowest=0.5)}) == 60
  assert watch.deadline({"w": _p(3, 3, progress.CALL, slowest=9)}) == 90


def _launch(tmp_path, config_text, program, *args, flags=(), env=None):
  """The launch's output; a short grace period: a hung task never exits on SIGTERM."""
  (tmp_path / "config.yaml").write_text(config_text)
  process = subprocess.Popen(
      [sys.executable, "-m", "tfdist", "launch", str(tmp_path / "config.yaml"), "--logs",
       str(tmp_path / "logs"), "--grace-period", "3", *flags, "--", sys.executable,
       str(PROGRAMS / program), *args],
      env={**ENV, **(env or {})}, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True, start_new_session=True)
  try:
    output, _ = process.communicate(timeout=280)
  finally:
    if process.poll() is None:
      os.killpg(process.pid, signal.SIGKILL)
      process.wait()
  return process.returncode, output


MWMS = "cluster: {worker: 2}\ncheckpoint: {dir: %s}\n"


@pytest.fixture(scope="module")
def uninterrupted_weights():
  return [np.asarray(w) for w in resumable.train_plain().get_weights()]


def test_a_worker_blocked_in_a_callback_is_named_its_stack_kept_and_the_restart_finishes(
    tmp_path, uninterrupted_weights):
  code, output = _launch(
      tmp_path, MWMS % (tmp_path / "checkpoints"), "resumable.py",
      # 10 s: under load (a suite beside it) a restarted healthy worker's progress was seen
      # 5 s stale while its peer finished.
      flags=("--hang-timeout", "10", "--max-restarts", "1"),
      env={"HANG_AT": "1:3", "HANG_MARKER": str(tmp_path / "hung"), "TMPDIR": str(tmp_path)})
  assert code == 0, output[-4000:]
  line = next(l for l in output.splitlines() if "hang: " in l)
  assert "hang: worker-1 has not begun call" in line and "(epoch 2, after step 3)" in line, line
  assert f"in its log: {tmp_path / 'logs' / 'worker-1.log'}" in line, line
  log = (tmp_path / "logs" / "worker-1.log").read_text()
  assert "in block_forever" in log and "Thread 0x" in log, log[-3000:]
  assert "restarting the whole cluster" in output
  weights = json.loads(next(l for l in output.splitlines()
                            if l.startswith("[worker-0] RESULT ")).split("RESULT ", 1)[1])
  for got, want in zip(weights, uninterrupted_weights, strict=True):
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_a_slow_run_and_a_slow_epoch_end_are_never_named(tmp_path):
  code, output = _launch(
      tmp_path, MWMS % (tmp_path / "checkpoints"), "resumable.py",
      # 8 s: on a loaded machine (a suite beside it) a healthy worker was seen 3 s between two
      # calls; the first epoch's end takes 12 s, longer than the deadline, and pauses its clock.
      flags=("--hang-timeout", "8"),
      env={"STEP_LINES": "1", "SLOW_EPOCH_END": "12", "TMPDIR": str(tmp_path)})
  assert code == 0, output[-4000:]
  assert "hang:" not in output, output[-4000:]


def test_a_worker_blocked_in_its_own_loop_is_named_and_the_restart_finishes(tmp_path):
  config = ("cluster: {worker: 2}\ntraining: {global_batch_size: 32, mixed_precision: 'off', "
            f"steps_per_execution: 2}}\ncheckpoint: {{dir: {tmp_path / 'checkpoints'}}}\n")
  code, output = _launch(tmp_path, config, "custom_loop.py", str(tmp_path / "out"),
                         "reduce_mean", flags=("--hang-timeout", "10", "--max-restarts", "1"),
                         env={"HANG_AT": "2:2"})
  assert code == 0, output[-4000:]
  assert "hang: worker-1 has not begun call" in output, output[-4000:]
  assert "in block_forever" in (tmp_path / "logs" / "worker-1.log").read_text()
  custom_loop.assert_one_devices_weights(tmp_path / "out" / "result.npz")
