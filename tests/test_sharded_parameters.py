"""Parameter sharding (issue 62, `training.zero_stage: 3`) as a Keras user meets
it: a user's own `tfdist.TrainingLoop` step and a subclass's own `train_step` train as on one
device; during `tfdist.fit` the user's callbacks read whole weights and validation is plain
Keras's; after it the model is an ordinary one (Keras's evaluate, predict, save, load); what
cannot be sharded is refused in one line naming the key. The bytes each device holds, 2 and 3
replicas, two worker processes and a resume over another replica count:
tests/test_sharded_optimizer.py."""

import sys

import keras
import numpy as np
import pytest

import tfdist
from tfdist.testing import forked
from tests.conftest import REPO
from tests.launching import ENV, printed
from tests.programs import custom_loop, custom_train_step

pytestmark = pytest.mark.usefixtures("two_cpus")
STAGE_3 = {"zero_stage": 3}
MIRRORED = {"strategy": "mirrored", "devices": {"logical_cpus": 2}}


def _assert_same(got, want, atol=1e-5):
  for a, b in zip(got, want, strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol)


def test_a_users_own_loop_step_gives_one_devices_weights_losses_and_metrics():
  """TensorFlow's custom-training loop as a user ports it (`tape.gradient` over
  `model.trainable_variables`, `model.losses`' L2 term, a Keras accuracy), every weight held
  as halves: the hand-written one-device loop's weights, per-epoch losses and accuracies."""
  config = {**MIRRORED, "training": {"global_batch_size": 32, "mixed_precision": "off",
                                     "steps_per_execution": 3, **STAGE_3}}
  weights, losses, accuracies = custom_loop.train(config, "reduce_mean")
  want_weights, want_losses, want_accuracies = custom_loop.train_by_hand("reduce_mean", 3)
  _assert_same(weights, want_weights)
  np.testing.assert_allclose(losses, want_losses, atol=1e-5)
  np.testing.assert_allclose(accuracies, want_accuracies, atol=1e-6)


def test_a_loops_checkpoint_holds_the_whole_weights_and_a_restart_restores_them(tmp_path):
  """TrainingLoop's own checkpoints (tf.train.Checkpoint) of sharded weights: a second run
  over the same `checkpoint.dir` finds every epoch done and restores the first run's weights
  (a fresh model's would differ), which are the hand-written loop's."""
  config = {**MIRRORED, "checkpoint": {"dir": str(tmp_path)},
            "training": {"global_batch_size": 32, "mixed_precision": "off",
                         "steps_per_execution": 3, **STAGE_3}}
  first, _, _ = custom_loop.train(config, "reduce_mean")
  restored, losses, _ = custom_loop.train(config, "reduce_mean")
  assert losses == []  # Nothing left to train.
  _assert_same(restored, first, atol=0)
  _assert_same(first, custom_loop.train_by_hand("reduce_mean", 3)[0])


@pytest.mark.parametrize("style", ["reduce_mean", "compute_loss"])
def test_a_subclass_train_step_trains_as_one_device(style):
  """Keras's "customizing what happens in fit" train_step, unchanged: plain Keras's weights and
  losses on one device (momentum SGD: plain SGD keeps no state to shard)."""
  training = {"global_batch_size": 32, "mixed_precision": "off", **STAGE_3}
  weights, losses = custom_train_step.train({**MIRRORED, "training": training}, style, 0.9)
  want_weights, want_losses = custom_train_step.train_plain(style, momentum=0.9)
  _assert_same(weights, want_weights)
  np.testing.assert_allclose(losses, want_losses, atol=1e-5)


def test_batch_normalizations_statistics_stay_whole_and_train_as_plain_keras_mirrored(tmp_path):
  """BatchNormalization's moving statistics (non-trainable: not sharded) are updated in the
  step beside the sharded weights: every weight and each epoch's loss are plain Keras's own
  MirroredStrategy's (each replica normalises its half batch: not one device's)."""
  runs = {}
  for mode in ("plain", "stage_3"):
    done = forked.run([sys.executable, "-m", "tests.programs.batch_norm_mirrored", mode,
                       str(tmp_path / f"{mode}.npz")], env=ENV, cwd=REPO, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    runs[mode] = np.load(tmp_path / f"{mode}.npz")
  plain, sharded = runs["plain"], runs["stage_3"]
  assert len(plain.files) == 1 + 8  # Losses; 2 Dense x 2, BatchNormalization's 4.
  for name in plain.files:
    np.testing.assert_allclose(sharded[name], plain[name], atol=1e-5, err_msg=name)


@pytest.mark.parametrize("recurrent", ["GRU", "LSTM"])
def test_a_recurrent_layer_trains_as_plain_keras(recurrent):
  """Keras's recurrent layers read their weights inside a `tf.while_loop` (the scan): the
  step's gather is made around the loop, not in its body, so the tape reaches it (found
  2026-11-29 with the GRU of tests/programs/text_classifier.py: its three weights had no
  gradient); 2 steps a call. Token vectors into `recurrent` and a Dense: plain Keras on one
  device. (A gather lifted out of a loop of steps, stale after the first, fails the
  TrainingLoop test above.)"""
  def model_fn():
    keras.utils.set_random_seed(3)
    inputs = keras.Input((6,), dtype="int32")
    hidden = getattr(keras.layers, recurrent)(5)(keras.layers.Embedding(10, 4)(inputs))
    return keras.Model(inputs, keras.layers.Dense(2)(hidden))

  def compile_args():
    return dict(optimizer=keras.optimizers.Adam(0.01),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  rng = np.random.default_rng(1)
  tokens = rng.integers(0, 10, (64, 6)).astype("int32")
  labels = (tokens[:, 0] > 4).astype("int32")
  model = tfdist.fit(model_fn, tokens, labels, shuffle=False, verbose=0, compile=compile_args,
                     config={**MIRRORED, "training": {
                         "global_batch_size": 16, "epochs": 2, "mixed_precision": "off",
                         "steps_per_execution": 2, **STAGE_3}}).model
  plain = model_fn()
  plain.compile(**compile_args())
  plain.fit(tokens, labels, batch_size=16, epochs=2, shuffle=False, verbose=0)
  _assert_same(model.get_weights(), plain.get_weights())


def _model():
  keras.utils.set_random_seed(5)
  return keras.Sequential([keras.Input((16,)), keras.layers.Dense(24, activation="relu"),
                           keras.layers.Dense(2)])


def _compiled(model):
  model.compile(optimizer=keras.optimizers.Adam(0.01), metrics=["accuracy"],
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  return model


class _Seen(keras.callbacks.Callback):
  """What a user's callback reads at each epoch's end: the weights, by Keras's own method."""

  def __init__(self):
    super().__init__()
    self.weights = []

  def on_epoch_end(self, epoch, logs=None):
    self.weights.append(self.model.get_weights())


def test_a_step_gathers_the_weights_a_bucket_at_a_time():
  """Stage 3 on 2 logical CPUs, an MLP of nine weights (eight of 1 MiB or more,
  `step_peak`'s deep one): TensorFlow traced all-reduces of the weights that take in each
  weight once per replica, none more than its largest weight and 1 MiB (a bucket, freed once
  the backward pass leaves it), not the whole model in one (which a step would hold beside the
  whole gradients), and no all-reduce of the gradients; the weights are plain Keras's (1e-5)."""
  import json
  from tests.programs import step_peak
  done = forked.run([sys.executable, "-m", "tests.programs.step_peak", "2", "parameters",
                     "deep"], env=ENV, cwd=REPO, timeout=240)
  assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
  found = {name: values[0] for name, values in printed(done.stdout).items()}
  assert float(found["MAX_DIFF"]) < 1e-5, done.stdout[-3000:]
  sizes = [int(np.prod(w.shape)) for w in step_peak.model_fn(deep=True).trainable_weights]
  total, largest = (json.loads(found[k])["CollectiveReduceV2"]
                    for k in ("COLLECTIVES", "LARGEST_COLLECTIVES"))
  assert total == 2 * sum(sizes), (total, sizes)  # Each weight once a replica: no gradients.
  assert largest <= max(sizes) + (1 << 20) // 4 < sum(sizes), (largest, sizes)


def test_a_read_outside_a_step_gathers_that_weight_not_the_whole_model():
  """Keras's `get_weights` (and a checkpoint) reads weight by weight: each read gathers the
  replicas' parts of that weight, padded to the longest (2 replicas: at most twice its size),
  not every shard once per weight (the whole model times the weights, before); the values are
  the gathered whole model's."""
  gathered, read = [], {}

  class Counted(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
      held = self.model.trainable_weights[0]._tfdist_held
      gather = held.shards._gather
      held.shards._gather = lambda strategy, local: (
          gathered.append(sum(int(t.shape[0]) for t in local)), gather(strategy, local))[1]
      try:
        read["weights"] = [w.numpy() for w in self.model.trainable_weights]
      finally:
        held.shards._gather = gather
      read["whole"] = [w.numpy() for w in held.whole_values()]
  x, y = custom_loop.data()
  config = {**MIRRORED, "training": {"global_batch_size": 32, "epochs": 1,
                                     "mixed_precision": "off", **STAGE_3}}
  model = tfdist.fit(lambda: _compiled(_model()), x[:64], y[:64], config=config,
                     shuffle=False, verbose=0, callbacks=[Counted()]).model
  sizes = [int(np.prod(w.shape)) for w in model.trainable_weights]
  assert len(gathered) == len(sizes)  # One gather a weight.
  assert sum(gathered) <= 2 * sum(sizes), (gathered, sizes)
  _assert_same(read["weights"], read["whole"], atol=0)


def test_keras_sees_an_ordinary_model_during_and_after_fit(tmp_path, capsys):
  """During fit a user's callback's `get_weights` and Keras's validation read whole weights
  (plain Keras's, epoch by epoch); after it Keras's own evaluate, predict, `model.save`,
  `model.export` and fit run on an ordinary model, and plain Keras loads the file with the
  same weights."""
  x, y = custom_loop.data()
  plain, plain_seen = _compiled(_model()), _Seen()
  want = plain.fit(x[:192], y[:192], batch_size=32, epochs=2, shuffle=False, verbose=0,
                   validation_data=(x[192:], y[192:]), callbacks=[plain_seen]).history
  seen = _Seen()
  config = {**MIRRORED, "training": {"global_batch_size": 32, "epochs": 2,
                                     "mixed_precision": "off", **STAGE_3}}
  history = tfdist.fit(lambda: _compiled(_model()), x[:192], y[:192], config=config,
                       shuffle=False, verbose=0, validation_data=(x[192:], y[192:]),
                       callbacks=[seen])
  assert "weights sharded over 2 replicas, " in capsys.readouterr().out  # The start line.
  for got, expected in zip(seen.weights, plain_seen.weights, strict=True):
    _assert_same(got, expected)
  for key in ("val_loss", "val_accuracy", "loss"):
    np.testing.assert_allclose(history.history[key], want[key], atol=1e-5)
  model = history.model
  np.testing.assert_allclose(model.evaluate(x[192:], y[192:], verbose=0),
                             plain.evaluate(x[192:], y[192:], verbose=0), atol=1e-5)
  np.testing.assert_allclose(model.predict(x[:40], verbose=0),
                             plain.predict(x[:40], verbose=0), atol=1e-5)
  model.save(tmp_path / "model.keras")
  _assert_same(keras.saving.load_model(tmp_path / "model.keras").get_weights(),
               plain.get_weights())
  model.export(tmp_path / "served", verbose=False)  # TF Serving's SavedModel: whole weights.
  import tensorflow as tf
  served = tf.saved_model.load(str(tmp_path / "served"))  # Held: its variables live with it.
  np.testing.assert_allclose(served.serve(x[:40]), plain.predict(x[:40], verbose=0), atol=1e-5)
  # Keras's own fit goes on from there (the optimizer's state sharded as stage 2's).
  for trained in (model, plain):
    trained.fit(x[:192], y[:192], batch_size=32, epochs=1, shuffle=False, verbose=0)
  _assert_same(model.get_weights(), plain.get_weights())


@pytest.mark.parametrize("training,layer,optimizer,message", [
    ({}, {"kernel_constraint": "non_neg"}, None,
     "cannot shard this model's weights: a constraint rewrites a whole weight"),
    ({}, None, lambda: keras.optimizers.AdamW(0.01),
     "cannot shard this model's weights: weight_decay decays whole weights"),
    ({"gradient_accumulation_steps": 2}, None, None,  # A config's rule: `tfdist check` too.
     "stage 3 cannot be combined with training.gradient_accumulation_steps above 1: "
     "gradient accumulation keeps a whole accumulator"),
], ids=["constraint", "weight_decay", "accumulation"])
def test_what_cannot_be_sharded_is_refused_in_one_line(training, layer, optimizer, message):
  config = {**MIRRORED, "training": {"global_batch_size": 32, "epochs": 1,
                                     "mixed_precision": "off", **STAGE_3, **training}}

  def model_fn():
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(4, **(layer or {})),
                              keras.layers.Dense(2)])
    model.compile(optimizer=(optimizer or (lambda: keras.optimizers.Adam(0.01)))(),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
  x, y = custom_loop.data()
  with pytest.raises(tfdist.ConfigError) as refused:
    tfdist.fit(model_fn, x, y, config=config, verbose=0)
  assert str(refused.value).startswith(
      f"<dict>: training.zero_stage: {message}"), \
      str(refused.value)
  assert "\n" not in str(refused.value)


@pytest.mark.parametrize("strategy", ["central_storage", "one_device"])
def test_a_strategy_whose_replicas_do_not_each_hold_the_weights_is_refused_in_one_line(
    strategy):
  """(A split model's refusal is generated from `config.honoured`: tests/test_honoured.py.)"""
  with pytest.raises(tfdist.ConfigError) as refused:
    tfdist.load_config({"strategy": strategy, "training": STAGE_3})
  assert str(refused.value).startswith(
      "<dict>: training.zero_stage: needs strategy mirrored or multi_worker_mirrored"), \
      str(refused.value)
  assert "\n" not in str(refused.value)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_the_optimizers_state_is_shown_as_keras_shows_it_at_every_stage(stage, capsys):
  """`model.optimizer.variables` after a sharded fit is plain Keras's list: its names, paths,
  shapes and (each slot gathered from the replicas' shards) values after the same training;
  `model.summary()` counts the same optimizer parameters (before: 2 variables, "Optimizer
  params: 2"), and Keras's `get_state_tree` reads them."""
  x, y = custom_loop.data()
  keras.backend.clear_session()  # Each model's layers and optimizer get the same names.
  plain = _compiled(_model())
  plain.fit(x[:192], y[:192], batch_size=32, epochs=2, shuffle=False, verbose=0)
  keras.backend.clear_session()
  config = {**MIRRORED, "training": {"global_batch_size": 32, "epochs": 2,
                                     "mixed_precision": "off", "zero_stage": stage}}
  model = tfdist.fit(lambda: _compiled(_model()), x[:192], y[:192], config=config,
                     shuffle=False, verbose=0).model
  got, want = model.optimizer.variables, plain.optimizer.variables
  assert [(v.path, tuple(v.shape), v.dtype) for v in got] == \
      [(v.path, tuple(v.shape), v.dtype) for v in want]
  _assert_same([v.numpy() for v in got], [v.numpy() for v in want])
  capsys.readouterr()
  for shown in (model, plain):
    shown.summary()
  lines = [line for line in capsys.readouterr().out.splitlines() if "Optimizer params" in line]
  assert len(lines) == 2 and lines[0] == lines[1], lines
  state = model.get_state_tree()["optimizer_variables"]
  _assert_same(jax_free_leaves(state), jax_free_leaves(plain.get_state_tree()[
      "optimizer_variables"]))


def jax_free_leaves(tree) -> list:
  """A nested dict's leaves in key order."""
  if isinstance(tree, dict):
    return [leaf for key in sorted(tree) for leaf in jax_free_leaves(tree[key])]
  return [tree]
