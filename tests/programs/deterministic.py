"""A user's reproducible run: `tf.config.experimental.enable_op_determinism()` first, then a
plain Keras model trained with tfdist.fit under the launcher's config; the chief writes its
weights to OUT_DIR/weights.npz.

    python deterministic.py OUT_DIR [plain]

With `plain`, plain Keras trains it on one device (`model.fit`, batch 32, 2 epochs: the
launched config's), no tfdist: the reference.
"""

import os
import sys

import keras
import numpy as np
import tensorflow as tf

import tfdist

tf.config.experimental.enable_op_determinism()
OUT = sys.argv[1]

rng = np.random.default_rng(0)
x = rng.random((256, 16), dtype=np.float32)
y = (x.sum(axis=1) > 8).astype("int32")


def make_model():
  keras.utils.set_random_seed(5)
  return keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                           keras.layers.Dense(2)])


def compile_args():
  return dict(optimizer=keras.optimizers.Adam(0.01),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


if sys.argv[2:] == ["plain"]:
  model = make_model()
  model.compile(**compile_args())
  model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=2)
  os.makedirs(OUT, exist_ok=True)
  np.savez(os.path.join(OUT, "weights.npz"), *model.get_weights())
  sys.exit()
history = tfdist.fit(make_model, x, y, shuffle=False, verbose=2, compile=compile_args)
if tfdist.is_chief():
  os.makedirs(OUT, exist_ok=True)
  np.savez(os.path.join(OUT, "weights.npz"), *history.model.get_weights())
