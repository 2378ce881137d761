"""What `tfdist.fit` tells the user and refuses, in one process: the start-of-fit line, resuming
and starting over, a learning-rate schedule that ends early, a dataset batched by another size,
and a last batch that would leave a replica empty."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.machine.speed import Measurement
from tfdist.machine.precision import Precision
from tfdist.training import report
from tfdist.training.data import DataError, usable_count

pytestmark = pytest.mark.usefixtures("two_cpus")

X = np.random.default_rng(0).random((64, 8, 8, 1), dtype=np.float32)
Y = np.arange(64) % 10


def dense_model():
  return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(10)])


def conv_model():
  return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3),
                           keras.layers.Flatten(), keras.layers.Dense(10)])


def compile_args(learning_rate=0.1):
  return lambda: dict(optimizer=keras.optimizers.SGD(learning_rate),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def config(tmp_path=None, strategy="default", **training):
  return {"strategy": strategy, "devices": {"logical_cpus": 2 if strategy != "default" else 0},
          "training": {"global_batch_size": 16, "epochs": 3, "mixed_precision": "off",
                       **training},
          "checkpoint": {"dir": str(tmp_path / "ckpt")} if tmp_path else {}}


class StopAfter(keras.callbacks.Callback):
  def __init__(self, epoch):
    super().__init__()
    self.epoch = epoch

  def on_epoch_end(self, epoch, logs=None):
    if epoch + 1 == self.epoch:
      raise KeyboardInterrupt  # A crash after the epoch's backup was written.


def test_a_resumed_run_says_so_and_fresh_starts_over(tmp_path, capsys, monkeypatch):
  with pytest.raises(KeyboardInterrupt):
    tfdist.fit(dense_model, X, Y, config=config(tmp_path, epochs=4), compile=compile_args(),
               callbacks=[StopAfter(2)], verbose=0)
  history = tfdist.fit(dense_model, X, Y, config=config(tmp_path, epochs=4),
                       compile=compile_args(), verbose=0)
  assert len(history.history["loss"]) == 2  # Epochs 3 and 4.
  assert (f"tfdist: resuming at epoch 3 of 4 from {tmp_path}/ckpt/backup/local "
          "(`tfdist launch --fresh`, or TFDIST_FRESH=1, starts over)") in capsys.readouterr().out
  with pytest.raises(KeyboardInterrupt):
    tfdist.fit(dense_model, X, Y, config=config(tmp_path, epochs=4), compile=compile_args(),
               callbacks=[StopAfter(2)], verbose=0)
  monkeypatch.setenv("TFDIST_FRESH", "1")
  history = tfdist.fit(dense_model, X, Y, config=config(tmp_path, epochs=4),
                       compile=compile_args(), verbose=0)
  assert len(history.history["loss"]) == 4
  assert "resuming" not in capsys.readouterr().out


def test_a_schedule_ending_before_the_run_is_warned_about(capsys):
  schedule = keras.optimizers.schedules.CosineDecay(0.1, decay_steps=5)
  tfdist.fit(dense_model, X, Y, config=config(), compile=compile_args(schedule), verbose=0)
  assert ("tfdist: warning: the learning-rate schedule CosineDecay ends at step 5, but this run "
          "makes 12 optimizer steps (3 epochs x 4); the rate stays at its final value from "
          "epoch 2. Size decay_steps from the run's steps") in capsys.readouterr().out


def test_a_schedule_long_enough_or_endless_is_not_warned_about():
  cosine = keras.optimizers.schedules.CosineDecay(0.1, decay_steps=8, warmup_steps=4,
                                                  warmup_target=0.2)
  assert report.schedule_warning(cosine, updates=12, epochs=3, updates_per_epoch=4) is None
  exponential = keras.optimizers.schedules.ExponentialDecay(0.1, 2, 0.5)
  assert report.schedule_warning(exponential, updates=12, epochs=3, updates_per_epoch=4) is None
  polynomial = keras.optimizers.schedules.PolynomialDecay(0.1, 6)
  assert "ends at step 6" in report.schedule_warning(polynomial, updates=12, epochs=3,
                                                     updates_per_epoch=4)


def test_the_start_line_names_every_choice_and_how_to_turn_it_off():
  line = report.choices_line(strategy_name="mirrored", replicas=2, global_batch=64,
                             precision=Precision("bfloat16", "mixed_bfloat16"),
                             steps_per_execution=32, fused="Adam", accumulation=2)
  assert line == (
      "tfdist: mirrored, 2 replicas, global batch 64 (32 per replica). Unlike plain Keras: "
      "bfloat16 mixed precision (training.mixed_precision: off for float32); 32 steps per "
      "call, batch callbacks once per call (training.steps_per_execution: 1); fused "
      "Adam update, not Keras's arithmetic (training.fused_optimizer: false); one update every 2 batches "
      "(training.gradient_accumulation_steps: 1)")
  plain = report.choices_line(strategy_name="default", replicas=1, global_batch=None,
                              precision=Precision("off", "float32"), steps_per_execution=1,
                              fused=None, accumulation=1)
  assert plain == "tfdist: default, 1 replica, batch from the data."
  shuffled = report.choices_line(strategy_name="default", replicas=1, global_batch=32,
                                 precision=Precision("off", "float32"), steps_per_execution=1,
                                 fused=None, accumulation=1, shuffled_arrays=True)
  assert shuffled.endswith("Unlike plain Keras: arrays shuffled by (training.seed, epoch): one "
                           "order on every worker and replica count, not Keras's "
                           "(shuffle=False: the arrays' own order)")


@pytest.mark.parametrize("speedup,policy,said", [
    (1.83, "mixed_bfloat16", "Unlike plain Keras: bfloat16 mixed precision (auto: bfloat16 "
     "measured 1.83x float32 on Xeon [avx512_bf16] (cached); training.mixed_precision: off "
     "for float32)"),
    (0.62, "float32", "tfdist: default, 1 replica, global batch 8 (8 per replica). float32: "
     "bfloat16 measured 0.62x float32 on Xeon [avx512_bf16] (cached), not faster "
     "(training.mixed_precision: bfloat16 forces it)."),
])
def test_the_start_line_says_what_auto_measured(speedup, policy, said):
  measured = Precision("auto", policy, Measurement("bfloat16", "Xeon [avx512_bf16]", speedup,
                                                   cached=True))
  line = report.choices_line(strategy_name="default", replicas=1, global_batch=8,
                             precision=measured, steps_per_execution=1, fused=None,
                             accumulation=1)
  assert said in line, line


def test_steps_per_call_never_exceed_an_epoch(capsys):
  history = tfdist.fit(dense_model, X, Y, config=config(steps_per_execution=32),
                       compile=compile_args(), verbose=0)
  assert "4 steps per call" in capsys.readouterr().out
  assert history.model.steps_per_execution == 1  # The model's compile's, given back.


def test_evaluates_progress_counts_the_steps_the_data_has(capsys):
  """4 steps per call, 2 batches to evaluate: Keras's bar would say 4/2; tfdist's says 2/2."""
  history = tfdist.fit(dense_model, X, Y, config=config(steps_per_execution=32),
                       compile=compile_args(), verbose=0)
  history.model.steps_per_execution = 4
  capsys.readouterr()
  tfdist.evaluate(history.model, X[:32], Y[:32], config=config(), verbose=1)
  shown = capsys.readouterr().out
  assert "2/2" in shown and "4/2" not in shown, shown
  assert history.model.steps_per_execution == 4  # Given back.


def test_a_dataset_batched_by_another_size_than_the_config_is_refused():
  dataset = tf.data.Dataset.from_tensor_slices((X, Y)).batch(8)
  with pytest.raises(DataError, match=r"^train_data: a tf.data.Dataset must be batched by the "
                     r"global batch size, 16 .* Received: a dataset batched by 8$"):
    tfdist.fit(dense_model, dataset, config=config(), compile=compile_args(), verbose=0)


# One step per call: Keras's own loop. (tfdist's in-graph loop of several steps survives an empty
# replica batch; Keras's one-step function fails in Conv2DBackpropFilter.)
def test_no_replica_gets_an_empty_batch_from_numpy_input(capsys):
  x, y = X[:49], Y[:49]  # The last batch of 1 would leave the second replica empty.
  history = tfdist.fit(conv_model, x, y, config=config(strategy="mirrored", steps_per_execution=1),
                       compile=compile_args(), verbose=0)
  assert np.isfinite(history.history["loss"]).all()
  assert ("tfdist: train_data: its last batch of 1 examples would leave one of the 2 replicas "
          "without examples; the last 1 example(s) are left out of each epoch"
          ) in capsys.readouterr().out


def test_an_empty_replica_batch_from_a_dataset_is_explained():
  dataset = tf.data.Dataset.from_tensor_slices((X[:49], Y[:49])).batch(16)
  with pytest.raises(DataError, match=r"^train_data: a replica received an empty batch .* "
                     r"batch with drop_remainder=True"):
    tfdist.fit(conv_model, dataset, config=config(strategy="mirrored", steps_per_execution=1),
               compile=compile_args(), verbose=0)


@pytest.mark.parametrize("count,batch,replicas,usable", [
    (49, 16, 2, 48), (50, 16, 2, 50), (48, 16, 2, 48), (69, 16, 4, 68), (53, 16, 4, 52),
    (54, 16, 4, 52), (55, 16, 4, 55), (49, 16, 1, 49)])
def test_usable_count_leaves_out_only_what_would_empty_a_replica(count, batch, replicas, usable):
  assert usable_count(count, batch, replicas) == usable


def _assert_built_as(want) -> None:
  """`tfdist.fit` under `training.seed: 1` builds its model with the weights `want`."""
  built = []

  def model_fn():
    model = dense_model()
    built.append(model.get_weights())
    return model
  tfdist.fit(model_fn, X, Y, config=config(epochs=1, seed=1), compile=compile_args(), verbose=0)
  for got, expected in zip(built[0], want, strict=True):
    np.testing.assert_array_equal(got, expected)


def test_a_scripts_own_seed_wins_over_training_seed_and_the_start_line_says_so(capsys):
  """Before, the shipped configs' `training.seed: 1` re-seeded Keras before `make_model`,
  over the script's `keras.utils.set_random_seed(0)` (initial weights 0.83 apart), silently."""
  keras.utils.set_random_seed(0)
  want = dense_model().get_weights()  # Plain Keras, the script's seed.
  keras.utils.set_random_seed(0)
  _assert_built_as(want)
  line = next(line for line in capsys.readouterr().out.splitlines()
              if line.startswith("tfdist: default"))
  assert "Seeded by the script's seed 0 (keras.utils.set_random_seed), not training.seed 1." \
      in line, line


def test_training_seed_seeds_a_script_that_seeds_nothing():
  keras.utils.set_random_seed(1)
  want = dense_model().get_weights()
  from keras.src.utils import rng_utils
  from keras.src.backend.common import global_state
  global_state.set_global_attribute(rng_utils.GLOBAL_RANDOM_SEED, None)  # A fresh script.
  _assert_built_as(want)


def test_keras_progress_bar_ends_each_epoch_at_the_steps_it_ran(capsys):
  """A dataset function under mirrored on 2 replicas: 512 rows at a global batch of 32 are 16
  steps an epoch (by hand); Keras alone counted the pipeline's 32 per-replica batches
  ("32/32", its ms/step halved)."""
  import re
  x = np.random.default_rng(0).random((512, 4), dtype=np.float32)

  def dataset_fn(context):
    return tf.data.Dataset.from_tensor_slices((x, x[:, :1])).shard(
        context.num_input_pipelines, context.input_pipeline_id).batch(
            context.get_per_replica_batch_size(32))
  tfdist.fit(lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]), dataset_fn,
             epochs=2, verbose=2, compile=lambda: dict(optimizer="sgd", loss="mse"),
             config={"strategy": "mirrored", "devices": {"logical_cpus": 2},
                     "training": {"global_batch_size": 32, "mixed_precision": "off"}})
  assert re.findall(r"^(\d+)/(\d+) - ", capsys.readouterr().out, re.M) == [("16", "16")] * 2
