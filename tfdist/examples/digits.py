"""Trains a small classifier on scikit-learn's handwritten digits (1,797 8x8 images, shipped
inside the scikit-learn wheel: no download) under the strategy a tfdist config names.

  python -m tfdist.examples.digits --config configs/mirrored.yaml
"""

from __future__ import annotations

import numpy as np
from absl import app, flags, logging

import tfdist

flags.DEFINE_string("config", None, "A tfdist YAML config; unset reads TFDIST_CONFIG/TF_CONFIG.")
FLAGS = flags.FLAGS


def load_digits() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
  """The digits as float32 images in [0, 1] and int labels, split 80/20 in a fixed order."""
  from sklearn.datasets import load_digits as sklearn_digits

  x, y = sklearn_digits(return_X_y=True)
  x = (x / 16.0).astype("float32")
  y = y.astype("int32")
  order = np.random.default_rng(0).permutation(len(x))
  x, y = x[order], y[order]
  split = int(0.8 * len(x))
  return (x[:split], y[:split]), (x[split:], y[split:])


def make_model(seed: int = 1):
  import keras

  init = keras.initializers.GlorotUniform(seed=seed)
  return keras.Sequential([
      keras.Input((64,)),
      keras.layers.Dense(128, activation="relu", kernel_initializer=init),
      keras.layers.Dense(10, kernel_initializer=init),
  ])


def compile_args():
  import keras
  return dict(optimizer=keras.optimizers.Adam(1e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # TensorFlow's INFO lines (one per all-reduce).
  config = tfdist.load_config(FLAGS.config)
  (x_train, y_train), (x_test, y_test) = load_digits()
  # validation_data: evaluated at each epoch's end, and by an evaluator task if the config
  # has one (it evaluates the chief's checkpoints instead of training).
  history = tfdist.fit(lambda: make_model(config.training.seed or 1), x_train, y_train,
                       config=config, compile=compile_args, validation_data=(x_test, y_test),
                       verbose=2)
  model = history.model
  loss, accuracy = tfdist.evaluate(model, x_test, y_test, config=config, verbose=0)
  print(f"test loss {loss:.4f} accuracy {accuracy:.4f} "
        f"({config.strategy.name}, {model.distribute_strategy.num_replicas_in_sync} replicas)")


if __name__ == "__main__":
  app.run(main)
