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
  log_dir.mkdir()
  cluster = local_cluster(tfdist.load_config(config_path, environ={}).cluster)
  return [start_task(task, [sys.executable, str(PROGRAMS / "resumable.py")], cluster, log_dir,
                     config_path=config_path, env={"PYTHONPATH": str(REPO), **env})
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
    for got, want in zip(weights, uninterrupted_weights):
      np.testing.assert_allclose(got, want, atol=1e-5)

  # The user's CSVLogger appended after the restart: every epoch once, the first run's kept.
  rows = (tmp_path / "log.csv").read_text().splitlines()
  assert [row.split(",")[0] for row in rows] == ["epoch", *map(str, range(resumable.EPOCHS))]
  # Only the chief's files: its checkpoints and final model; no backups, no worker files.
  names = sorted(os.listdir(checkpoints))
  assert names == [f"epoch-{e:04d}.weights.h5" for e in range(4, 7)] + ["model.keras"], names
  assert [n for n in os.listdir(tmp) if n.startswith("tfdist-")] == []  # Workers' scratch.
