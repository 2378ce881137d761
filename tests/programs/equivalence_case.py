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

EPOCHS = 3
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
  history = tfdist.fit(model_fn, x, y, config=with_training(config, **options),
                       compile=lambda: compile_args(learning_rate), batch_size=GLOBAL_BATCH,
                       epochs=EPOCHS, shuffle=variant.startswith("shuffled"), verbose=0)
  model = history.model
  evaluation = tfdist.evaluate(model, x, y, batch_size=GLOBAL_BATCH, verbose=0)
  predictions = tfdist.predict(model, x[:40], batch_size=GLOBAL_BATCH, verbose=0)
  return {"history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
          "evaluate": [float(v) for v in evaluation],
          "predict": np.asarray(predictions).tolist(),
          "predict_dtype": str(np.asarray(predictions).dtype),
          "compute_dtype": model.layers[0].dtype_policy.compute_dtype,
          "weights": [w.tolist() for w in model.get_weights()]}


if __name__ == "__main__":
  config = tfdist.load_config()
  for name in sys.argv[1:] or ["plain"]:
    print(f"RESULT {name} " + json.dumps(train(config, name)), flush=True)
