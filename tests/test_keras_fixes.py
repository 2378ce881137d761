"""Each test runs Keras without tfdist's workaround and asserts the upstream bug is still there.
When one fails, upstream has fixed the bug: delete the workaround in
tfdist/training/keras_fixes.py and this test."""

import contextlib
import re
import sys

import pytest
import tensorflow as tf
import keras

import tfdist
from tfdist.testing.local_cluster import run_everywhere
from tfdist.training import keras_fixes
from tfdist.training.keras_fixes import without_fixes
from tests.conftest import PROGRAMS, REPO
from tests.programs.user_models import GuidesOwnStep


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


def _mirrored_model(**optimizer_args):
  strategy = tfdist.mirrored(logical_cpus=2)
  with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1, **optimizer_args), loss="mse")
  return model


@pytest.mark.usefixtures("two_cpus")
def test_keras_19246_mirrored_steps_per_execution_fails_without_the_fix():
  model = _mirrored_model()
  model.steps_per_execution = 4
  x = tf.ones((64, 4))
  with pytest.raises(tf.errors.InvalidArgumentError, match="must feed a value for placeholder"), \
      without_fixes():
    model.fit(x, x[:, :2], batch_size=8, verbose=0)
    pytest.fail("keras#19246 looks fixed: drop the steps_per_execution fix")


def test_keras_counts_an_update_more_each_epoch_of_data_of_unknown_length():
  """Since keras-team/keras#21262 the optimizer counts an update in `apply`, with no data
  dependency: Keras's own one-step function, on one device, counts one more each epoch whose
  data (of unknown length) ran out mid-call (the failing `get_next` does not stop it), so
  Adam's bias correction drifts. tfdist's looping function (`first_step`) runs a step only on
  a batch that is there: tests/test_fit.py's `unknown_length` case compares `iterations` on
  every strategy. When this fails, Keras counts right: the first step may be Keras's again."""
  import numpy as np
  keras.utils.set_random_seed(1)
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
  model.compile(optimizer=keras.optimizers.Adam(), loss="mse", steps_per_execution=1)
  x = np.ones((48, 4), "float32")
  unknown = tf.data.Dataset.from_tensor_slices((x, x[:, :2])).batch(8).filter(lambda *e: True)
  model.fit(unknown, epochs=2, verbose=0)
  assert int(model.optimizer.iterations.numpy()) == 2 * 6 + 2, \
      "Keras counts each epoch's updates right: drop the note in first_step"


@pytest.mark.usefixtures("two_cpus")
def test_keras_17187_a_model_compiled_again_outside_its_scope_fails_without_the_fix():
  """The transfer-learning guide's second phase: compiled again outside the scope it was built
  in, with a new optimizer (a string fails alike), Keras's next fit fails."""
  model = _mirrored_model()
  x = tf.ones((64, 4))
  with without_fixes():
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss="mse")
  with pytest.raises(RuntimeError, match="Mixing different tf.distribute.Strategy objects"), \
      without_fixes():
    model.fit(x, x[:, :2], batch_size=8, verbose=0)
    pytest.fail("keras#17187 looks fixed: drop the compile fix")


@pytest.mark.usefixtures("two_cpus")
def test_a_model_compiled_again_outside_its_scope_trains_with_the_fix():
  """With the fix: the optimizer and the metric made outside are made again in the model's
  scope, the caller's objects kept (tests/test_keras_contract.py's `fine_tuning` case checks
  the training against one device on two workers)."""
  from tfdist.training import keras_fixes
  keras_fixes.install()
  model = _mirrored_model()
  optimizer, metric = keras.optimizers.Adam(1e-4), keras.metrics.MeanSquaredError()
  model.compile(optimizer=optimizer, loss="mse", metrics=[metric])
  x = tf.ones((64, 4))
  model.fit(x, x[:, :2], batch_size=8, verbose=0)
  assert model.optimizer is optimizer and int(optimizer.iterations.numpy()) == 8
  assert all(type(v.value).__name__ == "SyncOnReadVariable" for v in metric.variables)


@pytest.mark.usefixtures("two_cpus")
def test_keras_20582_mirrored_gradient_accumulation_fails_without_the_fix():
  model = _mirrored_model(gradient_accumulation_steps=2)
  x = tf.ones((64, 4))
  with pytest.raises(RuntimeError, match="`merge_call` called while defining a new graph"), \
      without_fixes():
    model.fit(x, x[:, :2], batch_size=8, verbose=0)
    pytest.fail("keras#20582 looks fixed: drop the gradient accumulation fix")


@pytest.mark.usefixtures("two_cpus")
def test_keras_mirrored_ema_overwrite_fails_without_the_fix():
  """No upstream issue found (the same sync point in a cond as keras#20582): when this fails,
  drop `keras_fixes.overwrite_ema_outside_cond`."""
  model = _mirrored_model(use_ema=True, ema_overwrite_frequency=2)
  x = tf.ones((64, 4))
  with pytest.raises(RuntimeError, match="synchronization point"), without_fixes():
    model.fit(x, x[:, :2], batch_size=8, verbose=0)
    pytest.fail("Keras's EMA overwrite works under mirrored: drop overwrite_ema_outside_cond")


def _string_model():
  inputs = keras.Input((), dtype="string")
  lookup = keras.layers.StringLookup(vocabulary=["good", "bad"])(inputs)
  return keras.Model(inputs, keras.layers.Dense(1)(keras.ops.expand_dims(
      keras.ops.cast(lookup, "float32"), -1)))


@pytest.mark.usefixtures("two_cpus")
def test_keras_20585_mirrored_fit_of_string_inputs_fails_without_the_fix():
  strategy = tfdist.mirrored(logical_cpus=2)
  with strategy.scope():
    model = _string_model()
    model.compile(optimizer="sgd", loss="mse")
  x, y = tf.constant(["good", "bad"] * 8), tf.ones((16, 1))
  with pytest.raises(tf.errors.InvalidArgumentError, match="of string is not in the list"), \
      without_fixes():
    model.fit(x, y, batch_size=8, verbose=0)
    pytest.fail("keras#20585 looks fixed for strings: the symbolic build no longer adds them")


@pytest.mark.usefixtures("two_cpus")
def test_string_inputs_train_under_mirrored_with_the_fix():
  config = {"strategy": "mirrored", "devices": {"logical_cpus": 2},
            "training": {"global_batch_size": 8, "mixed_precision": "off"}}
  x, y = tf.constant(["good", "bad"] * 8), tf.ones((16, 1))
  history = tfdist.fit(_string_model, tf.data.Dataset.from_tensor_slices((x, y)).batch(8),
                       config=config, compile=dict(optimizer="sgd", loss="mse"), epochs=2,
                       verbose=0)
  assert len(history.history["loss"]) == 2


def test_the_one_keras_private_tfdist_replaces_for_gradients_still_exists():
  """`strategy.gradient_reduction` wraps Keras's `_all_reduce_sum_gradients`: the day Keras
  renames it, this fails (and compression, averaging, the custom-step arithmetic and the step
  clock with it)."""
  import keras
  from tfdist.strategy import gradient_reduction
  optimizer = keras.optimizers.SGD()
  assert callable(getattr(optimizer, gradient_reduction.PRIVATE))
  seen = []
  gradient_reduction.wrap(optimizer, lambda reduce, pairs: seen.append(pairs) or reduce(pairs))
  assert optimizer._all_reduce_sum_gradients([(1.0, "v")]) == [(1.0, "v")] and seen


def _two_async_saves(directory):
  """Two asynchronous checkpoints of a Keras model, its weights changed between them; the
  weights the second one holds."""
  import numpy as np
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  checkpoint = tf.train.Checkpoint(model=model)
  options = tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)
  checkpoint.save(str(directory / "a"), options=options)
  second = [w + 1 for w in model.get_weights()]
  model.set_weights(second)
  path = checkpoint.save(str(directory / "a"), options=options)
  checkpoint.sync()
  model.set_weights([np.zeros_like(w) for w in second])
  tf.train.Checkpoint(model=model).restore(path).expect_partial()
  return model.get_weights(), second


def test_keras_second_asynchronous_checkpoint_fails_without_the_fix(tmp_path):
  """Detector: fails once Keras's variable reuses its CPU copy (then delete
  `keras_fixes.repeatable_async_copies`)."""
  with pytest.raises(ValueError, match="singleton tf.Variables"):
    _two_async_saves(tmp_path)


def test_a_second_asynchronous_checkpoint_holds_its_own_step_with_the_fix(tmp_path):
  import numpy as np
  from tfdist.training.keras_fixes import repeatable_async_copies
  with repeatable_async_copies():
    restored, second = _two_async_saves(tmp_path)
  for got, want in zip(restored, second, strict=True):
    np.testing.assert_array_equal(got, want)


def _steps_of_each_epoch(fixed: bool, bar: bool = False, verbose: int = 0,
                         strategy=None) -> list[int]:
  """Keras's fit over data whose passes grow (2, then 3, then 4 batches), as the tf.data
  service's passes differ: the steps Keras ran in each epoch (`bar`: with Keras's progress bar
  fixed too, under `strategy` with tfdist's fixes for it, as `tfdist.fit` runs it)."""
  from tensorflow.python.ops import resource_variable_ops
  from tfdist.training import keras_fixes
  passes = resource_variable_ops.ResourceVariable(1, dtype=tf.int64)

  def a_longer_pass(_):  # A def, not a lambda: autograph re-parses a lambda's source line.
    return tf.data.Dataset.range(passes.assign_add(1)).map(
        lambda i: (tf.ones((2, 1)), tf.ones((2, 1))))
  data = tf.data.Dataset.from_tensors(0).flat_map(a_longer_pass)
  with strategy.scope() if strategy else contextlib.nullcontext():
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
  steps = []
  counted = keras.callbacks.LambdaCallback(
      on_epoch_begin=lambda epoch, logs: steps.append(0),
      on_train_batch_end=lambda batch, logs: steps.__setitem__(-1, steps[-1] + 1))
  with keras_fixes.epochs_of_their_own_length() if fixed else without_fixes(), \
      keras_fixes.fixed_for(model, strategy, training=True) if strategy else \
      contextlib.nullcontext(), \
      keras_fixes.each_epochs_own_progress_bar() if bar else contextlib.nullcontext():
    model.fit(data, epochs=3, callbacks=[counted], verbose=verbose)
  return steps


def test_tensorflow_41571_keras_cuts_a_longer_epoch_to_the_first_ones_length():
  # Keras takes 3 for the first epoch's length (its steps counted with the read that ended it)
  # and cuts the third, of 4 batches, there.
  assert _steps_of_each_epoch(fixed=False) == [2, 3, 3], \
      "tensorflow#41571 looks fixed: drop keras_fixes.epochs_of_their_own_length"


def test_each_epoch_reads_its_own_pass_to_its_end_with_the_fix():
  assert _steps_of_each_epoch(fixed=True) == [2, 3, 4]


def _bars(output: str) -> list[tuple[int, int]]:
  """Keras's end-of-epoch progress lines (`verbose=2`): (steps shown, of)."""
  return [(int(a), int(b)) for a, b in re.findall(r"^(\d+)/(\d+) - ", output, re.M)]


def test_keras_progress_bar_shows_the_first_epochs_count_for_every_later_epoch(capsys):
  steps = _steps_of_each_epoch(fixed=True, verbose=2)
  assert steps == [2, 3, 4] and _bars(capsys.readouterr().out) == [(2, 2), (2, 2), (2, 2)], \
      "Keras's bar counts each epoch's steps: drop keras_fixes.each_epochs_own_progress_bar"


@pytest.mark.usefixtures("two_cpus")
def test_the_progress_bar_counts_each_epochs_own_steps_with_the_fix(capsys):
  """Counted from the optimizer's updates, which tfdist's step (`first_step`) counts right;
  the reference is Keras's own batch callbacks, a step each (steps_per_execution 1)."""
  steps = _steps_of_each_epoch(fixed=True, bar=True, verbose=2,
                               strategy=tfdist.mirrored(logical_cpus=2))
  assert _bars(capsys.readouterr().out) == [(s, s) for s in steps] == [(2, 2), (3, 3), (4, 4)]


def test_keras_takes_a_guides_own_train_step_logs_over_its_metrics_read_across_replicas():
  """Keras reads its metrics at an epoch's end only when the step's logs have their keys; the
  guide's step nests the compiled ones, so Keras keeps the step's logs: under replicas, their
  mean of each replica's own partial result. tests/test_keras_contract.py's `guides_train_step`
  case checks the fix against one device."""
  from tfdist.training import keras_fixes
  inputs = keras.Input((4,))
  model = GuidesOwnStep(inputs, keras.layers.Dense(1)(inputs))
  model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
  x = tf.ones((8, 4))
  model.fit(x, x[:, :1], verbose=0)
  logs = model.train_step((x, x[:, :1]))
  assert set(logs) == {"loss", "compile_metrics"}, logs
  assert keras.Model._get_metrics_result_or_logs(model, logs) is logs, \
      "Keras reads a guide's train_step's metrics itself: drop keras_fixes._synced_metrics_or_logs"
  assert set(keras_fixes._synced_metrics_or_logs(model, logs)) == {"loss", "mae"}


def _custom_training_step(strategy, optimizer):
  """TensorFlow's "Custom training with tf.distribute.Strategy" step: the optimizer first
  applied inside the `tf.function`, replicated."""
  with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])

  @tf.function
  def step(x):
    def replica(x):
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x)))
      optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                    model.trainable_variables))
    strategy.run(replica, args=(x,))
  return step


@pytest.mark.usefixtures("two_cpus")
def test_keras_19246_an_optimizer_first_applied_in_a_replicated_step_fails_without_the_fix(
    monkeypatch):
  from keras.src.optimizers import base_optimizer
  keras_fixes.install()
  monkeypatch.setattr(base_optimizer.BaseOptimizer, "apply",
                      base_optimizer.BaseOptimizer.apply.__wrapped__)  # Keras's own.
  strategy = tfdist.mirrored(logical_cpus=2)
  with strategy.scope():
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
  with pytest.raises(tf.errors.InvalidArgumentError, match="must feed a value for placeholder"):
    _custom_training_step(strategy, optimizer)(tf.ones((8, 4)))
    pytest.fail("keras#19246 looks fixed: drop keras_fixes.built_before_its_step")


@pytest.mark.usefixtures("two_cpus")
def test_an_optimizer_first_applied_in_a_replicated_step_trains_with_the_fix():
  keras_fixes.install()
  strategy = tfdist.mirrored(logical_cpus=2)
  with strategy.scope():
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
  step = _custom_training_step(strategy, optimizer)
  step(tf.ones((8, 4)))
  step(tf.ones((8, 4)))
  assert int(optimizer.iterations.numpy()) == 2 and optimizer.built


class EncoderDecoder(keras.Model):
  """keras-io's VAE's shape: two parts, its own `train_step`, no `call`."""

  def __init__(self):
    super().__init__()
    self.encoder = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    self.decoder = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4)])

  def train_step(self, data):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(tf.square(self.decoder(self.encoder(data)) - data))
    grads = tape.gradient(loss, self.trainable_variables)
    self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
    return {"loss": loss}


def _fit_encoder_decoder():
  strategy = tfdist.mirrored(logical_cpus=2)
  with strategy.scope():
    model = EncoderDecoder()
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
  return model.fit(tf.ones((32, 4)), batch_size=8, epochs=1, verbose=0)


@pytest.mark.usefixtures("two_cpus")
def test_keras_cannot_build_a_model_without_call_under_a_strategy_without_the_fix():
  keras_fixes.install()
  with pytest.raises(RuntimeError, match="does not have a `call"), without_fixes():
    _fit_encoder_decoder()
    pytest.fail("Keras builds a model without `call` under a strategy: drop "
                "keras_fixes._optimizer_built")


@pytest.mark.usefixtures("two_cpus")
def test_a_model_without_call_trains_under_a_strategy_with_the_fix():
  keras_fixes.install()
  history = _fit_encoder_decoder()
  assert len(history.history["loss"]) == 1
