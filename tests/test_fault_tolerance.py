"""A multi-worker run survives a worker killed with SIGKILL: restarted, it resumes at the next
epoch with the optimizer's state and ends with an uninterrupted run's weights. Only the
chief's files remain in the checkpoint directory."""

import json
import os
import sys
import time

import numpy as np
import pytest

import tfdist
from tfdist.testing.local_cluster import (kill, local_cluster, running, start_task, wait)
from tests.conftest import PROGRAMS, REPO
from tests.programs import resumable

KILLED_AFTER_EPOCH = 3

pytestmark = pytest.mark.usefixtures("two_cpus")  # TensorFlow starts with the suite's devices.


def _start_cluster(config_path, log_dir, env):
  """Every task of the config's cluster, or the one process of a config without one."""
  log_dir.mkdir()
  cluster = local_cluster(tfdist.load_config(config_path, environ={}).cluster)
  argv, env = [sys.executable, str(PROGRAMS / "resumable.py")], {"PYTHONPATH": str(REPO), **env}
  if not cluster.tasks():
    import subprocess
    from tfdist.testing.local_cluster import TaskProcess
    log = log_dir / "local.log"
    with open(log, "wb") as out:
      process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                 env={**os.environ, **env, "TFDIST_CONFIG": str(config_path)},
                                 start_new_session=True)
    return [TaskProcess(None, process, log)]
  return [start_task(task, argv, cluster, log_dir, config_path=config_path, env=env)
          for task in cluster.tasks()]


def _wait_for(process, text, timeout):
  deadline = time.monotonic() + timeout
  while text not in process.output():
    assert process.process.poll() is None, process.output()[-3000:]
    assert time.monotonic() < deadline, f"no {text!r} in {timeout} s:\n{process.output()[-3000:]}"
    time.sleep(0.2)


def _lines(process, prefix):
  return [line[len(prefix):] for line in process.output().splitlines() if line.startswith(prefix)]


@pytest.fixture(scope="module")
def uninterrupted_weights():
  return [np.asarray(w) for w in resumable.train({"strategy": "default"}).get_weights()]


def test_killed_worker_resumes_at_next_epoch_with_uninterrupted_weights(
    tmp_path, uninterrupted_weights):
  checkpoints = tmp_path / "checkpoints"
  config = tmp_path / "mwms.yaml"
  config.write_text("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n"
                    f"checkpoint: {{dir: {checkpoints}}}\n")
  tmp = tmp_path / "tmp"
  tmp.mkdir()
  env = {"TMPDIR": str(tmp), "CSV_LOG": str(tmp_path / "log.csv")}
  with running(_start_cluster(config, tmp_path / "first", {**env, "PAUSE_AFTER_EPOCH":
                                                           str(KILLED_AFTER_EPOCH)})) as first:
    _wait_for(first[1], f"EPOCH_END {KILLED_AFTER_EPOCH - 1}", 180)
    kill([first[1]])  # SIGKILL, as a dead machine would.
    kill([first[0]])  # Its peer would fail or wait; the cluster restarts as a whole.
  assert (checkpoints / "backup" / "worker-1" / "latest.weights.h5").is_file()

  with running(_start_cluster(config, tmp_path / "second", env)) as second:
    wait(second, 180)
  for p in second:
    assert p.process.returncode == 0, p.output()[-3000:]
    assert _lines(p, "EPOCH_BEGIN ")[0] == str(KILLED_AFTER_EPOCH)  # Epoch k+1, 0-based k.
    weights = json.loads(_lines(p, "RESULT ")[0])
    for got, want in zip(weights, uninterrupted_weights, strict=True):
      np.testing.assert_allclose(got, want, atol=1e-5)

  # The user's CSVLogger appended after the restart: every epoch once, the first run's kept.
  rows = (tmp_path / "log.csv").read_text().splitlines()
  assert [row.split(",")[0] for row in rows] == ["epoch", *map(str, range(resumable.EPOCHS))]
  # Only the chief's files: its checkpoints and final model; no backups, no worker files.
  names = sorted(os.listdir(checkpoints))
  assert names == [f"epoch-{e:04d}.weights.h5" for e in range(4, 7)] + ["model.keras"], names
  assert [n for n in os.listdir(tmp) if n.startswith("tfdist-")] == []  # Workers' scratch.


@pytest.mark.parametrize("strategy", [
    "cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n",
    "strategy: mirrored\ndevices: {logical_cpus: 2}\n",
    "strategy: central_storage\ndevices: {logical_cpus: 2}\n"])
def test_a_sigterm_mid_epoch_saves_every_worker_at_one_step_and_the_restart_resumes_there(
    tmp_path, uninterrupted_weights, strategy):
  """SIGTERM to one worker of two (MultiWorkerMirrored), or to a one-process run, in epoch 3:
  every worker saves its backup after the same step and exits with 42; relaunched, they resume
  at the next step and end with an uninterrupted run's weights."""
  import signal
  checkpoints = tmp_path / "checkpoints"
  config = tmp_path / "config.yaml"
  config.write_text(f"{strategy}checkpoint: {{dir: {checkpoints}}}\n")
  tmp = tmp_path / "tmp"
  tmp.mkdir()
  with running(_start_cluster(config, tmp_path / "first",
                              {"TMPDIR": str(tmp), "PAUSE_AT": "2:3"})) as first:
    _wait_for(first[0], "PAUSED", 180)
    first[0].process.send_signal(signal.SIGTERM)
    wait(first, 60)
  saved = set()
  for p in first:
    assert p.process.returncode == 42, p.output()[-3000:]
    saved |= set(_lines(p, "tfdist: preempted: backup saved at "))
  assert len(saved) == 1, saved  # One step, on both workers.
  step = int(saved.pop().split("step ")[1].split(";")[0])  # Mid-epoch: 8 steps an epoch.
  assert 3 <= step <= 5, step  # The paused step, and at most the call after it.

  with running(_start_cluster(config, tmp_path / "second", {"TMPDIR": str(tmp)})) as second:
    wait(second, 180)
  for p in second:
    assert p.process.returncode == 0, p.output()[-3000:]
    assert _lines(p, "EPOCH_BEGIN ")[0] == "2"
    weights = json.loads(_lines(p, "RESULT ")[0])
    for got, want in zip(weights, uninterrupted_weights, strict=True):
      np.testing.assert_allclose(got, want, atol=1e-5)
  chief = second[0].output()
  assert f"tfdist: resuming at epoch 3 of 6, step {step + 1} from" in chief, chief[-3000:]
