"""TensorFlow's "Multi-worker training with Keras" ending, with the chief slow to save: every
worker saves (the chief to `argv[1]`'s real paths, the others aside, the page's
`write_filepath`), then every worker loads the chief's files: the model twice (two rounds of
fit, save, load), then a `CheckpointManager` checkpoint through `tf.train.latest_checkpoint`.
`CHIEF_DELAY` seconds pass on the chief before each save. Prints, per round, whether what the
worker loaded is the weights it trained (`LOADED_<round> True`) and the checkpoint it found."""

import json
import os
import pathlib
import sys
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf

out = pathlib.Path(sys.argv[1])
task = json.loads(os.environ["TF_CONFIG"])["task"]
chief = task["index"] == 0
delay = float(os.environ.get("CHIEF_DELAY", "3"))
aside = pathlib.Path(tempfile.mkdtemp())

strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
  model.compile(optimizer="sgd", loss="mse")
x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
y = x[:, :3] * 2.0


def same(weights_a, weights_b) -> bool:
  return all(np.allclose(a, b) for a, b in zip(weights_a, weights_b))


for round_ in (1, 2):
  model.fit(x, y, batch_size=16, epochs=1, verbose=0)
  if chief:
    time.sleep(delay)
  model.save(out / "model.keras" if chief else aside / "model.keras")
  loaded = keras.models.load_model(out / "model.keras")
  print(f"LOADED_{round_} {same(loaded.get_weights(), model.get_weights())}", flush=True)

checkpoint = tf.train.Checkpoint(model=model)
manager = tf.train.CheckpointManager(checkpoint, out / "ckpt" if chief else aside / "ckpt",
                                     max_to_keep=1)
if chief:
  time.sleep(delay)
manager.save()
latest = tf.train.latest_checkpoint(out / "ckpt")
print(f"LATEST {pathlib.Path(latest).name if latest else None}", flush=True)
