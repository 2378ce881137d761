"""TensorFlow's "Save and load a model using a distribution strategy" tutorial, the whole page,
with no tfdist in it: a model trained under `MirroredStrategy()` and saved with `model.save`;
loaded without a strategy and trained on; loaded inside another strategy's scope
(`OneDeviceStrategy`) and trained on; saved with `tf.saved_model.save`, loaded with
`tf.saved_model.load` and its serving signature called, without a strategy and inside a
`MirroredStrategy` on a distributed dataset; the subclassed model the page saves after one fit.
The page's `tensorflow_hub.KerasLayer` section is left out (tensorflow-hub wraps a SavedModel
for tf-keras, not Keras 3), and so is its `.save(saved_model_path)` of a SavedModel directory,
which Keras 3 refuses (`model.export` writes it). Scikit-learn's digits stand in for MNIST; the
shuffle is seeded.

Usage: python tf_save_and_load.py WORKDIR. Prints `RESULT <section> <json>`.
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

WORKDIR = sys.argv[1]
tf.keras.utils.set_random_seed(0)


def report(section, value):
  print("RESULT", section, json.dumps(value), flush=True)


def history(h):
  return h.history


mirrored_strategy = tf.distribute.MirroredStrategy()


def get_data():
  x, y = load_digits(return_X_y=True)
  x = (x / 16.0).reshape(-1, 8, 8, 1).astype("float32")
  mnist_train = tf.data.Dataset.from_tensor_slices((x[:1536], y[:1536]))
  mnist_test = tf.data.Dataset.from_tensor_slices((x[1536:], y[1536:]))
  BUFFER_SIZE = 1536
  BATCH_SIZE_PER_REPLICA = 32
  BATCH_SIZE = BATCH_SIZE_PER_REPLICA * mirrored_strategy.num_replicas_in_sync

  def scale(image, label):
    return tf.cast(image, tf.float32), label

  train_dataset = mnist_train.map(scale).cache().shuffle(BUFFER_SIZE, seed=7).batch(BATCH_SIZE)
  eval_dataset = mnist_test.map(scale).batch(BATCH_SIZE)
  return train_dataset, eval_dataset


def get_model():
  with mirrored_strategy.scope():
    model = tf.keras.Sequential([
        tf.keras.layers.Input(shape=(8, 8, 1)),
        tf.keras.layers.Conv2D(8, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(10)])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.Adam(),
                  metrics=[tf.metrics.SparseCategoricalAccuracy()])
    return model


model = get_model()
train_dataset, eval_dataset = get_data()
report("fit", history(model.fit(train_dataset, epochs=2, verbose=0)))

keras_model_path = os.path.join(WORKDIR, "keras_save.keras")
model.save(keras_model_path)

restored_keras_model = tf.keras.models.load_model(keras_model_path)
report("restored_fit", history(restored_keras_model.fit(train_dataset, epochs=2, verbose=0)))

another_strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
with another_strategy.scope():
  restored_keras_model_ds = tf.keras.models.load_model(keras_model_path)
  report("one_device_fit", history(restored_keras_model_ds.fit(train_dataset, epochs=2,
                                                               verbose=0)))

model = get_model()  # A fresh model.
saved_model_path = os.path.join(WORKDIR, "tf_save")
tf.saved_model.save(model, saved_model_path)

DEFAULT_FUNCTION_KEY = "serving_default"
loaded = tf.saved_model.load(saved_model_path)
inference_func = loaded.signatures[DEFAULT_FUNCTION_KEY]
predict_dataset = eval_dataset.map(lambda image, label: image)
for batch in predict_dataset.take(1):
  outputs = inference_func(batch)
  report("signature", [float(np.abs(next(iter(outputs.values())).numpy() -
                                    model.predict(batch, verbose=0)).max())])

another_strategy = tf.distribute.MirroredStrategy()
with another_strategy.scope():
  loaded = tf.saved_model.load(saved_model_path)
  inference_func = loaded.signatures[DEFAULT_FUNCTION_KEY]
  dist_predict_dataset = another_strategy.experimental_distribute_dataset(predict_dataset)
  for batch in dist_predict_dataset:
    result = another_strategy.run(inference_func, args=(batch,))
    print(result)
    break
# Every replica's rows, in order, are the model's predictions of the first batch.
rows = np.concatenate([r.numpy() for r in another_strategy.experimental_local_results(
    next(iter(result.values())))])
report("distributed_signature", float(np.abs(rows - model.predict(
    next(iter(predict_dataset)), verbose=0)).max()))


class SubclassedModel(tf.keras.Model):
  """Example model defined by subclassing `tf.keras.Model`."""

  output_name = "output_layer"

  def __init__(self):
    super().__init__()
    self._dense_layer = tf.keras.layers.Dense(5, dtype=tf.dtypes.float32, name=self.output_name)

  def call(self, inputs):
    return self._dense_layer(inputs)


my_model = SubclassedModel()
BATCH_SIZE_PER_REPLICA = 4
BATCH_SIZE = BATCH_SIZE_PER_REPLICA * mirrored_strategy.num_replicas_in_sync
dataset_size = 100
dataset = tf.data.Dataset.from_tensors(
    (tf.range(5, dtype=tf.float32), tf.range(5, dtype=tf.float32))).repeat(
        dataset_size).batch(BATCH_SIZE)
my_model.compile(optimizer="adam", loss="mean_squared_error")
report("subclassed_fit", history(my_model.fit(dataset, epochs=2, verbose=0)))
tf.saved_model.save(my_model, os.path.join(WORKDIR, "subclassed"))
x = tf.saved_model.load(os.path.join(WORKDIR, "subclassed"))
report("subclassed_signatures", sorted(x.signatures))
