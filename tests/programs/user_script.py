"""An ordinary Keras script ported to tfdist, as a user writes one: a tf.data pipeline built in
`tfdist.fit`'s argument list, validation data, the user's own callbacks and `model.save`.

    python user_script.py OUT_DIR [numpy|dataset|function|generator]

Under any config (TFDIST_CONFIG, set by `tfdist launch`); writes OUT_DIR/final.keras,
OUT_DIR/checkpoints/, OUT_DIR/log.csv, and on the chief OUT_DIR/result.npz (final weights and
the last loss). Prints `PLACED TASK WEIGHT DEVICE[,DEVICE...]`: each weight's copies' devices.
"""

import os
import sys

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import tfdist

OUT = sys.argv[1]
INPUT = sys.argv[2] if len(sys.argv) > 2 else "dataset"
BATCH = tfdist.global_batch_size()  # The config's (64 in the tests).
os.makedirs(OUT, exist_ok=True)

x, y = load_digits(return_X_y=True)
x, y = (x / 16.0).astype("float32")[:1024], y.astype("int32")[:1024]


def make_dataset():
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).prefetch(tf.data.AUTOTUNE)


def dataset_fn(context):
  return (tf.data.Dataset.from_tensor_slices((x, y)).shard(context.num_input_pipelines,
                                                            context.input_pipeline_id)
          .batch(context.get_per_replica_batch_size(BATCH)))


def batches():
  while True:
    for start in range(0, len(x), BATCH):
      yield x[start:start + BATCH], y[start:start + BATCH]


def make_model():
  keras.utils.set_random_seed(7)
  return keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                           keras.layers.Dense(10)])


train = {"numpy": None, "dataset": make_dataset(), "function": dataset_fn,
         "generator": batches()}[INPUT]
history = tfdist.fit(
    make_model, train if train is not None else x, y if train is None else None,
    compile=lambda: dict(optimizer=keras.optimizers.SGD(0.1),
                         loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
    steps_per_epoch=len(x) // BATCH if INPUT == "generator" else None,
    validation_data=(x[:256], y[:256]), verbose=2,
    callbacks=[keras.callbacks.ModelCheckpoint(os.path.join(OUT, "checkpoints",
                                                            "epoch-{epoch}.keras")),
               keras.callbacks.CSVLogger(os.path.join(OUT, "log.csv")),
               keras.callbacks.BackupAndRestore(os.path.join(OUT, "backup"))])
model = history.model
model.save(os.path.join(OUT, "final.keras"))
loss = history.history["loss"][-1]
print(f"task {tfdist.task()} chief {tfdist.is_chief()} final loss {loss:.4f}", flush=True)
TASK = tfdist.task().name if tfdist.task() else "local"
for weight in model.weights:  # Where each copy lives: a replicated variable's on each device.
  copies = getattr(weight.value, "values", None) or (weight.value,)
  print(f"PLACED {TASK} {weight.path} {','.join(c.device for c in copies)}", flush=True)
if tfdist.is_chief():
  np.savez(os.path.join(OUT, "result.npz"), loss=loss,
           **{f"w{i}": w for i, w in enumerate(model.get_weights())})
