"""`tfdist.fit` on every worker, then `model.predict` on the chief alone (`if
tfdist.is_chief()`, a natural habit): under multi_worker_mirrored Keras's predict is a
collective the other workers never enter."""

import keras
import numpy as np

import tfdist


def make_model():
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
  model.compile(optimizer="sgd", loss="mse")
  return model


x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
history = tfdist.fit(make_model, x, x[:, :2], epochs=1, verbose=0)
if tfdist.is_chief():
  print("PREDICTING", flush=True)
  history.model.predict(x, verbose=0)
  print("PREDICTED", flush=True)
