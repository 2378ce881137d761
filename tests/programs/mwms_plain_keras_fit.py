"""Plain Keras `model.fit` under MultiWorkerMirrored, without tfdist's fixes: prints whether
keras-team/keras#20585 is still there."""

import numpy as np
import tensorflow as tf
import keras

import tfdist
from tfdist.training.keras_fixes import without_fixes

strategy = tfdist.make_strategy()
x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
y = (x.sum(axis=1) > 0).astype("int32")
with strategy.scope():
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
  model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
try:
  with without_fixes():  # In a launched task Keras's own fit is fixed (keras_fixes.install).
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=1, verbose=0)
  print("KERAS_FIT_WORKS", flush=True)
except ValueError as e:
  print(f"KERAS_BUG_PRESENT {str(e).splitlines()[0][:80]}", flush=True)
