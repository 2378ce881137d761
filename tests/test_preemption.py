"""The launcher's side of preemption under `tfdist.fit`: a notice sent to `tfdist launch`
(SIGTERM, or the config's `checkpoint.preemption_signal`) is forwarded to every task; each
saves its backup after the same step and exits 42; the launcher exits 42, or restarts the
cluster on 42 within `--max-restarts`, and the run ends with an uninterrupted one-device run's
weights. The parameter-server chief saves and resumes the same way."""

import json
import re
import signal
import sys

import numpy as np
import pytest

from tests.conftest import PROGRAMS
from tests.launching import finish, read_until, start_launch
from tests.programs import resumable

MWMS = "cluster: {worker: 2}\nstrategy: multi_worker_mirrored\ncheckpoint: {dir: %s%s}\n"


@pytest.fixture(scope="module")
def uninterrupted_weights():
  """Plain Keras's weights for the same training on one device, uninterrupted."""
  return [np.asarray(w) for w in resumable.train_plain().get_weights()]


def _launch(tmp_path, config, *flags, name="logs", env=None):
  (tmp_path / "config.yaml").write_text(config)
  return start_launch(str(tmp_path / "config.yaml"), "--logs", str(tmp_path / name), *flags,
                      "--", sys.executable, str(PROGRAMS / "resumable.py"), env=env)


def _preempt_when_paused(launcher, signum, tmp_path, seen):
  """Sends `signum` to the launcher once worker-0 paused in epoch 3, lets it go on once
  worker-0 saw the notice."""
  read_until(launcher, r"\[worker-0\] PAUSED", 180, seen)
  launcher.send_signal(signum)
  read_until(launcher, rf"\[worker-0\] tfdist: {signum.name} received", 60, seen)
  (tmp_path / "go").touch()


def _saved_steps(log_dir):
  """The position each worker's log says its backup was saved at."""
  return {path.name: re.findall(r"tfdist: preempted: backup saved at ([^;]+);",
                                path.read_text()) for path in sorted(log_dir.glob("worker-*"))}


def _assert_uninterrupted(log_dir, want):
  """Both workers' logs end with the uninterrupted run's weights."""
  for path in sorted(log_dir.glob("worker-*.log")):
    results = re.findall(r"^RESULT (.*)", path.read_text(), re.M)
    assert results, path.read_text()[-3000:]
    for got, expected in zip(json.loads(results[-1]), want, strict=True):
      np.testing.assert_allclose(got, expected, atol=1e-5)


def test_sigterm_to_the_launcher_saves_every_worker_at_one_step_and_exits_42(tmp_path):
  config = MWMS % (tmp_path / "checkpoints", "")
  env = {"PAUSE_AT": "2:3", "GO_FILE": str(tmp_path / "go")}
  launcher, seen = _launch(tmp_path, config, env=env), []
  _preempt_when_paused(launcher, signal.SIGTERM, tmp_path, seen)
  output = finish(launcher, 120, seen)
  assert launcher.returncode == 42, output[-3000:]
  assert "SIGTERM received: forwarded to every task, which may save its backup" in output
  assert "every task saved its backup: exiting with 42 (restart to resume)" in output
  # The step after the paused one: tfdist asked before the user's callback paused.
  assert _saved_steps(tmp_path / "logs") == {"worker-0.log": ["epoch 3, step 4"],
                                             "worker-1.log": ["epoch 3, step 4"]}
  # Relaunched, it resumes there: the next test (a restart within --max-restarts).


def test_the_configs_preemption_signal_is_forwarded_and_max_restarts_resumes_after_42(
    tmp_path, uninterrupted_weights):
  config = MWMS % (tmp_path / "checkpoints", ", preemption_signal: SIGUSR1")
  env = {"PAUSE_AT": "2:3", "GO_FILE": str(tmp_path / "go")}
  launcher, seen = _launch(tmp_path, config, "--max-restarts", "1", env=env), []
  _preempt_when_paused(launcher, signal.SIGUSR1, tmp_path, seen)
  output = finish(launcher, 240, seen)
  assert launcher.returncode == 0, output[-3000:]
  assert "SIGUSR1 received: forwarded to every task" in output
  assert "saved its backup after a preemption notice (exit code 42)" in output
  assert "restarting the whole cluster (0 restart(s) left after this)" in output
  assert _saved_steps(tmp_path / "logs")["worker-1.log"] == ["epoch 3, step 4"]
  assert "tfdist: resuming at epoch 3 of 6, step 5 from" in output, output[-3000:]
  _assert_uninterrupted(tmp_path / "logs", uninterrupted_weights)


def test_the_parameter_server_chief_saves_on_a_notice_and_the_relaunch_resumes(tmp_path):
  (tmp_path / "config.yaml").write_text(
      "cluster: {chief: 1, worker: 2, ps: 1}\nstrategy: parameter_server\n"
      "training: {global_batch_size: 32, steps_per_epoch: 40, steps_per_execution: 1, "
      "epochs: 5, mixed_precision: 'off'}\n"
      f"checkpoint: {{dir: {tmp_path / 'checkpoints'}}}\n")

  def launch(name):  # A loaded machine's chief took over 5 s to exit after its save, once.
    return start_launch(str(tmp_path / "config.yaml"), "--logs", str(tmp_path / name),
                        "--grace-period", "30", "--", sys.executable,
                        str(PROGRAMS / "ps_fit.py"))
  launcher, seen = launch("logs"), []
  read_until(launcher, r"\[chief-0\] Epoch 3/5", 180, seen)
  launcher.send_signal(signal.SIGTERM)
  output = finish(launcher, 120, seen)
  assert launcher.returncode == 42, output[-3000:]
  (saved,) = re.findall(r"\[chief-0\] tfdist: preempted: backup saved at ([^;]+);", output)
  assert 3 <= int(re.search(r"epoch (\d+)", saved).group(1)) <= 4, saved  # Where it was.

  relaunched = launch("logs2")
  output = finish(relaunched, 240, [])
  assert relaunched.returncode == 0, output[-3000:]
  assert re.search(r"\[chief-0\] tfdist: resuming at epoch [34] of 5", output), output[-3000:]
  chief = json.loads(re.search(r"\[chief-0\] RESULT (.*)", output).group(1))
  assert chief["epochs"][-1] == 4 and chief["iterations"] >= 5 * 40


def test_a_servers_chief_watch_stops_after_a_notice_only_when_probes_miss_it_in_a_row():
  """One missed probe of a live chief (a connect timing out on a loaded machine) once stopped
  every server while the chief saved from their variables: the save failed, no exit 42."""
  from tfdist.machine.chief_watch import ChiefWatch
  watch = ChiefWatch("127.0.0.1:1", gone_seconds=30)
  assert watch.probed(True, stopping=False, now=0) is None
  # After the notice: a miss, then the chief again, then misses in a row (a second apart).
  probes = [watch.probed(reachable, stopping=True, now=1 + i)
            for i, reachable in enumerate([False, True, False, False, False, False])]
  stops = [i for i, why in enumerate(probes) if why]
  assert stops and stops[0] in (3, 4), probes  # After two or three misses in a row, not one.
  assert probes[stops[0]] == "the chief at 127.0.0.1:1 is gone: stopping"
  # Without a notice: gone once unreachable for gone_seconds after it was seen.
  quiet = ChiefWatch("127.0.0.1:1", gone_seconds=30)
  assert [quiet.probed(False, stopping=False, now=t) for t in (0, 100)] == [None, None]  # Unseen.
  quiet.probed(True, stopping=False, now=101)
  assert [quiet.probed(False, stopping=False, now=t) for t in (102, 131)] == [None, None]
  assert quiet.probed(False, stopping=False, now=132) == (
      "the chief at 127.0.0.1:1 is gone for 30 s: the job is done; stopping")
