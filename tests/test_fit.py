"""tfdist.fit/evaluate/predict give one device's results under every sync strategy: the same
per-epoch losses and metrics, evaluation, predictions and final weights, within 1e-5."""

import json
import sys

import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist import ConfigError
from tfdist.training.data import DataError, make_dataset, reads_files
from tfdist.testing.local_cluster import run_everywhere
from tests.conftest import PROGRAMS, REPO
from tests.programs import equivalence_case as case

pytestmark = pytest.mark.usefixtures("two_cpus")
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def one_device_result():
  return case.train({"strategy": "default"})


def assert_same_training(result, reference):
  assert result["history"].keys() == reference["history"].keys() == {"loss", "accuracy"}
  for key in reference["history"]:
    np.testing.assert_allclose(result["history"][key], reference["history"][key],
                               atol=TOLERANCE, err_msg=key)
  np.testing.assert_allclose(result["evaluate"], reference["evaluate"], atol=TOLERANCE)
  np.testing.assert_allclose(result["predict"], reference["predict"], atol=TOLERANCE)
  for got, want in zip(result["weights"], reference["weights"]):
    np.testing.assert_allclose(got, want, atol=TOLERANCE)


def test_training_actually_learns(one_device_result):
  losses = one_device_result["history"]["loss"]
  assert len(losses) == case.EPOCHS and losses[-1] < losses[0] - 0.05


@pytest.mark.parametrize("strategy", ["one_device", "mirrored", "central_storage"])
def test_single_machine_strategies_equal_one_device(strategy, one_device_result):
  result = case.train({"strategy": strategy, "devices": {"logical_cpus": 2}})
  assert_same_training(result, one_device_result)


def test_multi_worker_mirrored_on_two_processes_equals_one_device(tmp_path, one_device_result):
  config = tmp_path / "mwms.yaml"
  config.write_text("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
  processes = run_everywhere(config, [sys.executable, str(PROGRAMS / "equivalence_case.py")],
                             tmp_path, 180, env={"PYTHONPATH": str(REPO)})
  for p in processes:
    assert p.process.returncode == 0, p.output()[-3000:]
    line = next(l for l in p.output().splitlines() if l.startswith("RESULT "))
    assert_same_training(json.loads(line[len("RESULT "):]), one_device_result)


def test_dataset_function_gets_each_replicas_input_context():
  seen = []

  def dataset_fn(context):
    seen.append((context.num_replicas_in_sync, context.get_per_replica_batch_size(32)))
    x, y = case.data()
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16)

  history = tfdist.fit(case.model_fn, dataset_fn, config={"strategy": "mirrored",
                                                          "devices": {"logical_cpus": 2}},
                       compile=case.compile_args, epochs=1, verbose=0)
  assert seen == [(2, 16)]
  assert np.isfinite(history.history["loss"][0])


def test_batch_size_comes_from_the_config():
  x, y = case.data()
  config = {"strategy": "mirrored", "devices": {"logical_cpus": 2},
            "training": {"per_replica_batch_size": 16, "epochs": 2}}
  history = tfdist.fit(case.model_fn, x, y, config=config, compile=case.compile_args,
                       verbose=0)
  assert len(history.history["loss"]) == 2
  assert history.model.distribute_strategy.num_replicas_in_sync == 2


def test_numpy_without_any_batch_size_is_a_clear_error():
  x, y = case.data()
  with pytest.raises(DataError, match=r"^train_data: numpy input needs a batch size: set "
                     r"training.global_batch_size .* Received: batch_size=None$"):
    tfdist.fit(case.model_fn, x, y, config={"strategy": "default"}, compile=case.compile_args)


def test_uncompiled_model_without_compile_arguments_is_a_clear_error():
  x, y = case.data()
  with pytest.raises(ConfigError, match="model_fn returned a model that is not compiled"):
    tfdist.fit(case.model_fn, x, y, config={"strategy": "default"}, batch_size=32)


def test_jit_compile_is_refused_where_xla_fails():
  config = {"strategy": "mirrored", "devices": {"logical_cpus": 2},
            "training": {"jit_compile": True}}
  with pytest.raises(ConfigError, match=r"training.jit_compile: must be false under mirrored"):
    tfdist.fit(case.model_fn, *case.data(), config=config, compile=case.compile_args)


def test_shard_policy_is_file_for_file_datasets_and_data_otherwise(tmp_path):
  path = str(tmp_path / "data.tfrecord")
  with tf.io.TFRecordWriter(path) as writer:
    writer.write(b"example")
  policy = tf.data.experimental.AutoShardPolicy
  strategy = tf.distribute.get_strategy()
  files = make_dataset(tf.data.TFRecordDataset([path]).batch(2), strategy=strategy,
                       batch_size=None)
  memory = make_dataset(tf.data.Dataset.range(4).batch(2), strategy=strategy, batch_size=None)
  assert reads_files(files) and not reads_files(memory)
  assert files.options().experimental_distribute.auto_shard_policy == policy.FILE
  assert memory.options().experimental_distribute.auto_shard_policy == policy.DATA


def test_unsupported_training_data_is_named():
  with pytest.raises(DataError, match=r"^train_data: must be numpy arrays, a tf.data.Dataset, or "
                     r"a function of a tf.distribute.InputContext. Received: str$"):
    tfdist.fit(case.model_fn, "data.csv", config={"strategy": "default"},
               compile=case.compile_args)


def test_multi_worker_strategy_made_too_late_says_what_to_do(tmp_path):
  import subprocess
  script = ("import tensorflow as tf, tfdist\n"
            "tf.constant(1.0) + 1\n"
            "tfdist.make_strategy({'cluster': {'worker': ['127.0.0.1:1', '127.0.0.1:2']},"
            " 'task': 'worker:0'})\n")
  result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
  assert result.returncode == 1
  assert ("tfdist.errors.DeviceSetupError: multi_worker_mirrored must be made before TensorFlow "
          "runs anything") in result.stderr
