"""tfdist.fit/evaluate/predict give plain Keras's one-device results (`model.fit` on one device)
under every sync strategy: the same per-epoch losses and metrics, evaluation, predictions and
final weights, within 1e-5."""

import json
import sys

import numpy as np
import pytest
import tensorflow as tf
import keras

import tfdist
from tfdist import ConfigError
from tfdist.errors import ModelError
from tfdist.training.data import DataError, make_dataset, reads_files
from tfdist.testing.local_cluster import run_everywhere
from tests.conftest import PROGRAMS, REPO
from tests.programs import equivalence_case as case

pytestmark = pytest.mark.usefixtures("two_cpus")
TOLERANCE = 1e-5


# bfloat16 keeps 8 bits of mantissa (float16 11): splitting a batch over replicas changes the
# rounding, by a step of 2**-7 of a value where it crosses one (1.46 against 1.45 on an AVX2 CPU
# without oneDNN: a prediction 0.012 apart, 0.8% of it).
HALF_TOLERANCE, HALF_RTOL = 1e-2, 2**-7


@pytest.fixture(scope="module")
def reference():
  """Plain Keras's result for a variant on one device (`model.fit`, no tfdist), trained once
  per module."""
  results = {}

  def get(variant):
    if variant not in results:  # One device is told the learning rate 2 replicas scale to.
      rate = 2 * case.LEARNING_RATE if variant == "scaled_lr" else case.LEARNING_RATE
      results[variant] = case.train_plain(variant, rate)
    return results[variant]
  return get


def assert_same_training(result, reference, variant="plain"):
  half = case.HALF_PRECISION.get(variant)
  tolerance = dict(atol=HALF_TOLERANCE, rtol=HALF_RTOL) if half else dict(atol=TOLERANCE)
  assert result["history"].keys() == reference["history"].keys() == {"loss", "accuracy"}
  for key in reference["history"]:
    np.testing.assert_allclose(result["history"][key], reference["history"][key],
                               **tolerance, err_msg=key)
  np.testing.assert_allclose(result["evaluate"], reference["evaluate"], **tolerance)
  np.testing.assert_allclose(result["predict"], reference["predict"], **tolerance)
  for got, want in zip(result["weights"], reference["weights"], strict=True):
    np.testing.assert_allclose(got, want, **tolerance)
  if "iterations" in result:  # The updates made.
    assert result["iterations"] == reference["iterations"], variant
  if half:
    assert result["compute_dtype"] == half and result["predict_dtype"] == "float32"


def test_training_actually_learns(reference):
  losses = reference("plain")["history"]["loss"]
  assert len(losses) == case.EPOCHS and losses[-1] < losses[0] - 0.03


@pytest.mark.parametrize("strategy,variant", [
    ("one_device", "plain"), ("default", "shuffled_steps_per_execution")] + [
    (strategy, variant) for strategy in ("mirrored", "central_storage")
    for variant in case.VARIANTS
    if not (strategy == "central_storage" and variant.startswith("float16"))])  # Refused.
def test_single_machine_strategies_equal_one_device(strategy, variant, reference):
  result = case.train({"strategy": strategy, "devices": {"logical_cpus": 2}}, variant)
  assert_same_training(result, reference(variant), variant)


def test_multi_worker_mirrored_on_two_processes_equals_one_device(tmp_path, reference):
  config = tmp_path / "mwms.yaml"
  config.write_text("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
  processes = run_everywhere(config, [sys.executable, str(PROGRAMS / "equivalence_case.py"),
                                      *case.VARIANTS], tmp_path, 300,
                             env={"PYTHONPATH": str(REPO)})
  for p in processes:
    assert p.process.returncode == 0, p.output()[-3000:]
    results = dict(line.split(" ", 2)[1:] for line in p.output().splitlines()
                   if line.startswith("RESULT "))
    assert results.keys() == case.VARIANTS.keys()
    for variant, result in results.items():
      assert_same_training(json.loads(result), reference(variant), variant)


def test_learning_rate_is_scaled_by_replicas_and_warmed_up_over_an_epoch():
  x, y = case.data()
  config = {"strategy": "mirrored", "devices": {"logical_cpus": 2},
            "training": {"scale_learning_rate": True, "warmup_epochs": 1, **case.BASE}}
  seen = []
  record = keras.callbacks.LambdaCallback(
      on_train_batch_begin=lambda batch, logs: seen.append(
          float(history_model[0].optimizer.learning_rate)))
  history_model = []
  record.set_model = lambda model: history_model.append(model)
  tfdist.fit(case.model_fn, x, y, config=config, compile=case.compile_args, batch_size=32,
             epochs=2, callbacks=[record], verbose=0)
  steps_per_epoch = 256 // 32
  expected = [2 * case.LEARNING_RATE * min(1.0, (step + 1) / steps_per_epoch)
              for step in range(2 * steps_per_epoch)]
  np.testing.assert_allclose(seen, expected, rtol=1e-6)


def test_warmup_needs_to_know_the_steps_in_an_epoch():
  config = {"strategy": "default", "training": {"warmup_epochs": 1}}
  with pytest.raises(ConfigError, match=r"training.warmup_epochs: needs the number of steps in "
                     r"an epoch, .* set training.steps_per_epoch"):
    unknown_length = tf.data.Dataset.range(8).batch(2).filter(lambda b: b[0] < 6)
    tfdist.fit(case.model_fn, unknown_length, config=config,
               compile=case.compile_args)


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


def test_uncompiled_model_without_compile_arguments_is_a_clear_error():
  x, y = case.data()
  with pytest.raises(ModelError, match="model_fn returned a model that is not compiled"):
    tfdist.fit(case.model_fn, x, y, config={"strategy": "default"}, batch_size=32)


def test_jit_compile_is_refused_where_xla_fails():
  config = {"strategy": "mirrored", "devices": {"logical_cpus": 2},
            "training": {"jit_compile": True}}
  with pytest.raises(ConfigError, match=r"training.jit_compile: cannot be true under mirrored"):
    tfdist.fit(case.model_fn, *case.data(), config=config, compile=case.compile_args)


def test_fit_keeps_the_jit_compile_keras_chooses_unless_the_config_sets_it(monkeypatch):
  """Keras's default `jit_compile="auto"` turns XLA on for a GPU outside tf.distribute
  (`Trainer._resolve_auto_jit_compile`). Here, on a CPU, that rule is made to answer as on a
  GPU: tfdist.fit's model must compile as plain Keras's does (forcing XLA off measured 2.8-4.9x
  slower than Keras on an H200), keep a user's explicit choice, and take the config's."""
  monkeypatch.setattr(keras.Model, "_resolve_auto_jit_compile", lambda self: True)
  x, y = case.data()

  def jit_of(compile_extra, config_extra):
    def compiled():
      return {**case.compile_args(), **compile_extra}
    training = {"global_batch_size": 64, "mixed_precision": "off", **config_extra}
    history = tfdist.fit(case.model_fn, x, y, config={"strategy": "default",
                                                      "training": training},
                         compile=compiled, epochs=1, verbose=0)
    return history.model.jit_compile

  plain = case.model_fn()
  plain.compile(**case.compile_args())
  assert plain.jit_compile is True  # Keras's own answer, on the "GPU".
  assert jit_of({}, {}) is plain.jit_compile
  assert jit_of({"jit_compile": False}, {}) is False  # The user's own compile.
  assert jit_of({}, {"jit_compile": False}) is False  # The config's.


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
  with pytest.raises(DataError, match=r"^train_data: must be numpy arrays, a tf.data.Dataset, a "
                     r"keras.utils.PyDataset, a Python generator or a function of a "
                     r"tf.distribute.InputContext. Received: str$"):
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


@pytest.mark.usefixtures("two_cpus")
def test_local_accumulation_all_reduces_once_per_update():
  """Under mirrored, 4-batch accumulation runs the gradients' all-reduce on every 4th batch
  only (tfdist.training.accumulation), counted in the graph as it runs."""
  import keras
  import tensorflow as tf

  counter = tf.Variable(0, trainable=False)  # A plain variable: each replica adds 1.

  class CountAllReduces(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
      optimizer = self.model.optimizer
      reduce = optimizer._all_reduce_sum_gradients

      def counted(grads_and_vars):
        counter.assign_add(1)
        return reduce(grads_and_vars)
      optimizer._all_reduce_sum_gradients = counted

  x, y = case.data()
  config = {"strategy": "mirrored", "devices": {"logical_cpus": 2},
            "training": {"mixed_precision": "off", "gradient_accumulation_steps": 4,
                         "steps_per_execution": 3}}
  tfdist.fit(case.model_fn, x, y, config=config, compile=case.compile_args, batch_size=32,
             epochs=2, verbose=0, shuffle=False, callbacks=[CountAllReduces()])
  assert int(counter.numpy()) == 2 * (2 * 8 // 4)  # 2 replicas x 4 updates in 16 batches.
