"""A user's model compiled with Keras's defaults (jit_compile="auto": XLA on a GPU) and split
over this process's two devices with tfdist.parallel.split, then trained with plain model.fit;
prints `LOSSES <first> <last>`, each device's variables, and `PLAIN_LOSSES <first> <last>` of
the same model unsplit in plain Keras on one CPU.

    python split_default_compiled.py     (devices from the config: devices.logical_gpus: 2)
"""

import keras
import numpy as np
import tensorflow as tf

import tfdist
from tfdist.parallel import split

tfdist.make_strategy(tfdist.load_config())  # Sets up the config's devices (two logical GPUs).
rng = np.random.default_rng(0)
x, y = rng.random((512, 32), dtype=np.float32), rng.random((512, 4), dtype=np.float32)
keras.utils.set_random_seed(1)
model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(64, activation="relu"), keras.layers.Dense(4)])
model.compile("adam", "mse")
split(model, "balanced", microbatches=2)
history = model.fit(x, y, batch_size=64, epochs=3, verbose=0)
print("LOSSES", history.history["loss"][0], history.history["loss"][-1], flush=True)
with tf.device("/CPU:0"):  # The reference: the same model unsplit, plain Keras on one CPU.
  keras.utils.set_random_seed(1)
  plain = keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                            keras.layers.Dense(64, activation="relu"), keras.layers.Dense(4)])
  plain.compile("adam", "mse", jit_compile=False)
  losses = plain.fit(x, y, batch_size=64, epochs=3, verbose=0).history["loss"]
print("PLAIN_LOSSES", losses[0], losses[-1], flush=True)
for layer in model.layers:
  print("PLACED", layer.name, layer.kernel.value.device, flush=True)
