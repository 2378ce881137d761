"""Each test runs Keras without tfdist's workaround and asserts the upstream bug is still there.
When one fails, upstream has fixed the bug: delete the workaround in
tfdist/training/keras_fixes.py and this test."""

import sys

import pytest
import tensorflow as tf
import keras

import tfdist
from tfdist.testing.local_cluster import run_everywhere
from tests.conftest import PROGRAMS, REPO


@pytest.mark.usefixtures("two_cpus")
def test_keras_21054_central_storage_metric_counts_old_total_once_per_replica():
  strategy = tfdist.central_storage(logical_cpus=2)
  with strategy.scope():
    metric = keras.metrics.Sum()

  @tf.function
  def step():
    strategy.run(lambda: metric.update_state(1.0))

  step()
  step()
  # Two replicas add 1.0 per step: the truth is 4.0. Keras gives (0+1)+(0+1)=2, then
  # (2+1)+(2+1)=6.
  assert float(metric.result()) == 6.0, "keras#21054 looks fixed: drop the CentralStorage fix"


def test_keras_20585_multi_worker_fit_fails_without_the_fix(tmp_path):
  config = tmp_path / "mwms.yaml"
  config.write_text("cluster: {worker: 2}\n")
  processes = run_everywhere(config, [sys.executable, str(PROGRAMS / "mwms_plain_keras_fit.py")],
                             tmp_path, 120, env={"PYTHONPATH": str(REPO)})
  output = processes[0].output()
  assert "KERAS_FIT_WORKS" not in output, "keras#20585 looks fixed: drop the multi-worker fix"
  assert "KERAS_BUG_PRESENT Attempt to convert a value (PerReplica" in output, output[-3000:]
