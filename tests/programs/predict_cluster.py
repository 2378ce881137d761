"""Trains briefly with `tfdist.fit` under the launcher's config, then predicts 1,003 rows with
`tfdist.predict` (the fast path) on every task, and writes, per task, the largest difference from
the same weights' one-device prediction and the output's shape to OUT_DIR/<task>.json.

    python predict_cluster.py OUT_DIR
"""

import json
import os
import sys

import keras
import numpy as np

import tfdist

rng = np.random.default_rng(0)
x, y = rng.random((1003, 12), dtype=np.float32), rng.integers(0, 5, 1003)


def make_model():
  keras.utils.set_random_seed(2)
  return keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"),
                           keras.layers.Dense(5)])


model = tfdist.fit(make_model, x[:512], y[:512], compile=lambda: dict(
    optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
    verbose=0).model
predictions = tfdist.predict(model, x, batch_size=64)
reference = make_model()
reference.set_weights(model.get_weights())
expected = reference.predict(x, batch_size=64, verbose=0)
with open(os.path.join(sys.argv[1], f"{tfdist.task().name}.json"), "w") as f:
  json.dump({"difference": float(np.abs(predictions - expected).max()),
             "shape": list(predictions.shape)}, f)
