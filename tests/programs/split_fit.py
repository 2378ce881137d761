"""A Keras script trained by `tfdist.fit` with the config's `parallel:` section; also trains
the same model unsplit with plain Keras, and writes the largest weight difference and each
layer's device to RESULT (JSON).

    python split_fit.py RESULT
"""

import json
import sys

import keras
import numpy as np
import tensorflow as tf

import tfdist

rng = np.random.default_rng(0)
x, y = rng.random((256, 16), dtype=np.float32), rng.integers(0, 4, 256)


def make_model():
  keras.utils.set_random_seed(5)
  return keras.Sequential([keras.Input((16,))] + [
      keras.layers.Dense(32, activation="relu", name=f"hidden_{i}") for i in range(4)] +
      [keras.layers.Dense(4, name="logits")])


def compile_args():
  return dict(optimizer=keras.optimizers.Adam(0.01),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
model = tfdist.fit(make_model, dataset, compile=compile_args, verbose=2).model
reference = make_model()
reference.compile(**compile_args())
reference.fit(dataset, epochs=2, verbose=0)
difference = max(float(np.abs(a - b).max())
                 for a, b in zip(model.get_weights(), reference.get_weights()))
devices = {layer.name: layer.weights[0].value.device.split("device:")[-1]
           for layer in model.layers}
with open(sys.argv[1], "w") as f:
  json.dump({"difference": difference, "devices": devices}, f)
