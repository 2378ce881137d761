"""Keras's "Multi-GPU distributed training with TensorFlow" guide, the whole page, with no
tfdist in it: `MirroredStrategy()`, the model built and compiled in its scope, fit with
validation data and evaluate inside it; then "Using callbacks to ensure fault tolerance":
`make_or_restore_model` and `run_training` twice, each making its own `MirroredStrategy`, the
second restoring the first's `ModelCheckpoint` file. Scikit-learn's digits stand in for MNIST;
the page's datasets are not shuffled.

Usage: python keras_multi_gpu.py WORKDIR [TRAIN_ROWS]: TRAIN_ROWS (1536 by default, 40 whole
batches after validation's 256) of the digits for training, the rest for the test. Prints
`RESULT <section> <json>`.
"""

import json
import os
import sys

os.environ["KERAS_BACKEND"] = "tensorflow"

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

WORKDIR = sys.argv[1]
TRAIN_ROWS = int(sys.argv[2]) if len(sys.argv) > 2 else 1536
keras.utils.set_random_seed(0)


def report(section, value):
  print("RESULT", section, json.dumps(value), flush=True)


def get_compiled_model():
  inputs = keras.Input(shape=(64,))
  x = keras.layers.Dense(64, activation="relu")(inputs)
  x = keras.layers.Dense(64, activation="relu")(x)
  outputs = keras.layers.Dense(10)(x)
  model = keras.Model(inputs, outputs)
  model.compile(optimizer=keras.optimizers.Adam(),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=[keras.metrics.SparseCategoricalAccuracy()])
  return model


def get_dataset():
  batch_size = 32
  num_val_samples = 256
  x, y = load_digits(return_X_y=True)
  x = (x / 16.0).astype("float32")
  y = y.astype("float32")
  x_train, y_train = x[:TRAIN_ROWS], y[:TRAIN_ROWS]
  x_test, y_test = x[TRAIN_ROWS:], y[TRAIN_ROWS:]
  x_val = x_train[-num_val_samples:]
  y_val = y_train[-num_val_samples:]
  x_train = x_train[:-num_val_samples]
  y_train = y_train[:-num_val_samples]
  return (tf.data.Dataset.from_tensor_slices((x_train, y_train)).batch(batch_size),
          tf.data.Dataset.from_tensor_slices((x_val, y_val)).batch(batch_size),
          tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(batch_size))


strategy = tf.distribute.MirroredStrategy()
print("Number of devices: {}".format(strategy.num_replicas_in_sync))
with strategy.scope():
  model = get_compiled_model()
  train_dataset, val_dataset, test_dataset = get_dataset()
  report("fit", model.fit(train_dataset, epochs=2, validation_data=val_dataset,
                          verbose=0).history)
  report("evaluate", model.evaluate(test_dataset, verbose=0))

checkpoint_dir = os.path.join(WORKDIR, "ckpt")
if not os.path.exists(checkpoint_dir):
  os.makedirs(checkpoint_dir)


def make_or_restore_model():
  checkpoints = [checkpoint_dir + "/" + name for name in os.listdir(checkpoint_dir)]
  if checkpoints:
    latest_checkpoint = max(checkpoints, key=os.path.getctime)
    print("Restoring from", latest_checkpoint)
    return keras.models.load_model(latest_checkpoint)
  print("Creating a new model")
  return get_compiled_model()


def run_training(epochs=1):
  strategy = tf.distribute.MirroredStrategy()
  with strategy.scope():
    model = make_or_restore_model()
    callbacks = [keras.callbacks.ModelCheckpoint(
        filepath=checkpoint_dir + "/ckpt-{epoch}.keras", save_freq="epoch")]
    history = model.fit(train_dataset, epochs=epochs, callbacks=callbacks,
                        validation_data=val_dataset, verbose=2)
  return history.history, model


first, _ = run_training(epochs=1)
report("first_run", first)
second, model = run_training(epochs=1)
report("second_run", second)
report("checkpoints", sorted(os.listdir(checkpoint_dir)))
report("weights", [w.tolist() for w in model.get_weights()])
