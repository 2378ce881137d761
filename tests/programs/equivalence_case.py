"""One model, seed and data, trained under any config and any of a few training variants: the
equivalence tests compare the results across strategies. Run as a script it trains every
variant named on the command line under the environment's config (a task of a launched
cluster) and prints one `RESULT <variant> <json>` line each."""

import dataclasses
import json
import sys

import numpy as np

import tfdist
from tfdist.config.loader import as_config

EPOCHS = 2
GLOBAL_BATCH = 32
LEARNING_RATE = 0.1

# float32, one step per call: the speed defaults change the arithmetic (bfloat16) or hide
# per-batch callbacks; variants turn knobs on one at a time.
BASE = {"mixed_precision": "off", "steps_per_execution": 1}
# Training options per variant; "shuffled..." also shuffle the numpy input.
VARIANTS = {
    "plain": {},
    "shuffled": {"seed": 7},
    "steps_per_execution": {"steps_per_execution": 4},
    # 8 steps an epoch run as 3 + 3 + 2: no call may cross into the next epoch.
    "shuffled_steps_per_execution": {"seed": 7, "steps_per_execution": 3},
    "accumulation": {"gradient_accumulation_steps": 2},
    # Updates every 3 batches of 8-step epochs run as calls of 5 + 3: accumulation across calls
    # and epochs.
    "accumulation_across_calls": {"gradient_accumulation_steps": 3, "steps_per_execution": 5},
    "scaled_lr": {"scale_learning_rate": True, "warmup_epochs": 1},
    "bfloat16": {"mixed_precision": "bfloat16"},
    # Loss scaling (Keras's LossScaleOptimizer) with tfdist's accumulation fix inside it.
    "float16_accumulation": {"mixed_precision": "float16", "gradient_accumulation_steps": 2},
    # The arrays as a dataset whose length tf.data cannot tell (as a TFRecord file's): each
    # epoch ends when the data does (under multi_worker_mirrored an epoch counted an update
    # more, found 2026-11-29: `iterations` is compared).
    "unknown_length": {},
}
HALF_PRECISION = {"bfloat16": "bfloat16", "float16_accumulation": "float16"}


def data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(256, 8)).astype("float32")
  y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype("int32")
  return x, y


def model_fn():
  import keras
  init = keras.initializers.GlorotUniform
  return keras.Sequential([
      keras.Input((8,)),
      keras.layers.Dense(16, activation="relu", kernel_initializer=init(1)),
      keras.layers.Dense(2, kernel_initializer=init(2)),
  ])


def compile_args(learning_rate=LEARNING_RATE):
  import keras
  return dict(optimizer=keras.optimizers.SGD(learning_rate),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])


def with_training(config, **options):
  config = as_config(config)
  return dataclasses.replace(config, training=dataclasses.replace(config.training, **options))


def train(config, variant="plain", learning_rate=LEARNING_RATE):
  x, y = data()
  options = {**BASE, **VARIANTS[variant]}
  inputs = dict(x=x, y=y, batch_size=GLOBAL_BATCH)
  if variant == "unknown_length":
    import tensorflow as tf
    inputs = dict(x=tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).filter(
        lambda *element: True))
  history = tfdist.fit(model_fn, inputs.pop("x"), **inputs,
                       config=with_training(config, **options),
                       compile=lambda: compile_args(learning_rate),
                       epochs=EPOCHS, shuffle=variant.startswith("shuffled"), verbose=0)
  model = history.model
  evaluation = tfdist.evaluate(model, x, y, batch_size=GLOBAL_BATCH, verbose=0)
  predictions = tfdist.predict(model, x[:40], batch_size=GLOBAL_BATCH, verbose=0)
  return {"history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
          "evaluate": [float(v) for v in evaluation],
          "predict": np.asarray(predictions).tolist(),
          "predict_dtype": str(np.asarray(predictions).dtype),
          "compute_dtype": model.layers[0].dtype_policy.compute_dtype,
          "iterations": int(model.optimizer.iterations.numpy()),
          "weights": [w.tolist() for w in model.get_weights()]}


def train_plain(variant="plain", learning_rate=LEARNING_RATE):
  """The variant trained by plain Keras on one device (`model.fit`, no tfdist): the reference
  every strategy's result must equal. Each option is spelled as a Keras user spells it."""
  import keras
  options = {**BASE, **VARIANTS[variant]}
  half = HALF_PRECISION.get(variant)
  keras.config.set_dtype_policy(f"mixed_{half}" if half else "float32")
  try:
    model = model_fn()
  finally:
    keras.config.set_dtype_policy("float32")
  args = compile_args(learning_rate)
  if options.get("warmup_epochs"):  # Scaled by one replica: the rate ramps over an epoch.
    args["optimizer"] = keras.optimizers.SGD(_Warmup(learning_rate, len(data()[0]) //
                                                     GLOBAL_BATCH))
  if options.get("gradient_accumulation_steps"):
    args["optimizer"] = keras.optimizers.SGD(
        learning_rate, gradient_accumulation_steps=options["gradient_accumulation_steps"])
  model.compile(**args, steps_per_execution=options["steps_per_execution"])
  x, y = data()
  history = fit_plain(model, x, y, EPOCHS, options.get("seed"))
  predictions = model.predict(x[:40], batch_size=GLOBAL_BATCH, verbose=0)
  return {"history": history,
          "evaluate": [float(v) for v in model.evaluate(x, y, batch_size=GLOBAL_BATCH,
                                                        verbose=0)],
          "predict": np.asarray(predictions).tolist(),
          "predict_dtype": str(np.asarray(predictions).dtype),
          "compute_dtype": model.layers[0].dtype_policy.compute_dtype,
          "iterations": int(model.optimizer.iterations.numpy()),
          "weights": [w.tolist() for w in model.get_weights()]}


def fit_plain(model, x, y, epochs, seed=None):
  """Plain `model.fit`, epoch by epoch in tfdist's documented shuffled order (epoch e's a
  stateless shuffle of seed (seed, e)) when `seed` is given; returns the history's dict."""
  import tensorflow as tf
  history = {}
  for epoch in range(epochs):
    order = np.arange(len(x)) if seed is None else tf.random.experimental.stateless_shuffle(
        tf.range(len(x), dtype=tf.int64), seed=[seed, epoch]).numpy()
    logs = model.fit(x[order], y[order], batch_size=GLOBAL_BATCH, epochs=epoch + 1,
                     initial_epoch=epoch, shuffle=False, verbose=0).history
    for key, values in logs.items():
      history.setdefault(key, []).extend(float(v) for v in values)
  return history


def _Warmup(rate, steps):
  import keras

  class Warmup(keras.optimizers.schedules.LearningRateSchedule):
    def __call__(self, step):
      return rate * keras.ops.minimum(1.0, (keras.ops.cast(step, "float32") + 1.0) / steps)
  return Warmup()


if __name__ == "__main__":
  config = tfdist.load_config()
  for name in sys.argv[1:] or ["plain"]:
    print(f"RESULT {name} " + json.dumps(train(config, name)), flush=True)
