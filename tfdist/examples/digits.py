"""Trains a small classifier on scikit-learn's handwritten digits (1,797 8x8 images, shipped
inside the scikit-learn wheel: no download) under the strategy a tfdist config names.

  python -m tfdist.examples.digits --config configs/mirrored.yaml
"""

from __future__ import annotations

import numpy as np
from absl import app, flags

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


def main(argv):
  del argv
  config = tfdist.load_config(FLAGS.config)
  strategy = tfdist.make_strategy(config)
  import keras

  (x_train, y_train), (x_test, y_test) = load_digits()
  sizes = tfdist.batch_sizes(config.training, strategy.num_replicas_in_sync)
  with strategy.scope():  # Keras records the strategy when the model is built.
    model = make_model(config.training.seed or 1)
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
  model.fit(x_train, y_train, batch_size=sizes.global_batch_size or 64,
            epochs=config.training.epochs, verbose=2)
  loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
  print(f"test loss {loss:.4f} accuracy {accuracy:.4f} "
        f"({config.strategy.name}, {strategy.num_replicas_in_sync} replicas)")


if __name__ == "__main__":
  app.run(main)
