"""A training script as Keras's guides write it, its tf.data pipeline (a map of a few ms an
example) run by the launch's tf.data service: `tfdist.fit`, or `tfdist.TrainingLoop` with
LOOP=1; with OWN_STEP=1 a model subclass with its own `train_step`, as Keras's "Customizing
what happens in fit()" guide writes it (the global batch then the dataset's: 16 when the config
gives none); fit prints Keras's progress lines (verbose=2) and `STEPS n`, the updates of each
epoch. With MIDWAY=1 the chief prints `MIDWAY` after the third call of epoch 1 and waits
3 s (a test kills a data worker then). Each example's target is its id; Keras Metric subclasses
count how many times each id was trained on in the epoch, over every worker. The chief prints
`EPOCHS <json>`: per epoch, [ids trained on once, ids trained on more than once, ids trained
on]."""

import json
import os
import time

import keras
import numpy as np
import tensorflow as tf

import tfdist
from tests.programs.user_models import GuidesOwnStep

ROWS, EPOCHS = 192, 3


class Once(keras.metrics.Metric):
  """Ids trained on exactly once since the last reset (over every replica and worker)."""

  def __init__(self, name="once", **kwargs):
    super().__init__(name=name, **kwargs)
    self.counts = self.add_weight(shape=(ROWS,), initializer="zeros", name="counts")

  def update_state(self, y_true, y_pred, sample_weight=None):
    ids = tf.cast(tf.reshape(y_true, [-1]), tf.int32)
    self.counts.assign_add(tf.math.bincount(ids, minlength=ROWS, maxlength=ROWS,
                                            dtype=tf.float32))

  def result(self):
    return tf.reduce_sum(tf.cast(tf.equal(self.counts, 1.0), tf.float32))


class Again(Once):
  """Ids trained on more than once."""

  def __init__(self, **kwargs):
    super().__init__(name="again", **kwargs)

  def result(self):
    return tf.reduce_sum(tf.cast(self.counts > 1.0, tf.float32))


class Seen(Once):
  """Ids trained on at all."""

  def __init__(self, **kwargs):
    super().__init__(name="seen", **kwargs)

  def result(self):
    return tf.reduce_sum(tf.cast(self.counts > 0.0, tf.float32))


def slow(x, y):
  """A few ms of matrix products an example: the input costs more than the step."""
  m = tf.reshape(tf.tile(x, [64]), (16, 16))
  for _ in range(40):
    m = tf.tanh(tf.linalg.matmul(m, m) / 16.0)
  return x + 0.0 * m[0, :4], y


def dataset(batch):
  ids = np.arange(ROWS, dtype=np.float32)
  features = np.random.default_rng(0).random((ROWS, 4), dtype=np.float32)
  return tf.data.Dataset.from_tensor_slices((features, ids)).map(slow).batch(batch)


def model():
  if os.environ.get("OWN_STEP"):
    inputs = keras.Input((4,))
    return GuidesOwnStep(inputs, keras.layers.Dense(1)(inputs))
  return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])


class Steps(keras.callbacks.Callback):
  """Prints `STEPS n` at each epoch's end: the optimizer's updates in the epoch."""

  def on_epoch_begin(self, epoch, logs=None):
    self.began = int(self.model.optimizer.iterations.numpy())

  def on_epoch_end(self, epoch, logs=None):
    print(f"STEPS {int(self.model.optimizer.iterations.numpy()) - self.began}", flush=True)


class Midway(keras.callbacks.Callback):
  def on_train_batch_end(self, batch, logs=None):
    if self.epoch == 1 and batch == 2 and tfdist.is_chief():
      print("MIDWAY", flush=True)
      time.sleep(3)

  def on_epoch_begin(self, epoch, logs=None):
    self.epoch = epoch


def with_fit(config):
  history = tfdist.fit(model, dataset(config.training.global_batch_size or 16), config=config,
                       compile=lambda: dict(optimizer=keras.optimizers.SGD(1e-6), loss="mse",
                                            metrics=[Once(), Again(), Seen()]),
                       epochs=EPOCHS, verbose=2, callbacks=[Steps()] +
                       ([Midway()] if os.environ.get("MIDWAY") else []))
  return [[history.history[k][e] for k in ("once", "again", "seen")] for e in range(EPOCHS)]


def with_loop(config):
  loop = tfdist.TrainingLoop(config)
  with loop.scope():
    net, optimizer = model(), keras.optimizers.SGD(1e-6)
    metrics = [Once(), Again(), Seen()]
  loop.prepare(net, optimizer, *metrics)
  loss_fn = keras.losses.MeanSquaredError()

  def train_step(x, y):
    with tf.GradientTape() as tape:
      predicted = net(x, training=True)
      loss = loss_fn(y, predicted)
    optimizer.apply_gradients(zip(tape.gradient(loss, net.trainable_variables),
                                  net.trainable_variables))
    for metric in metrics:
      metric.update_state(y, predicted)
    return {"loss": loss}

  epochs, data = [], dataset(loop.global_batch_size)
  for _ in loop.epochs(EPOCHS):
    for _ in loop.run(train_step, data):
      pass
    epochs.append([float(m.result()) for m in metrics])
    for metric in metrics:
      metric.reset_state()
  return epochs


if __name__ == "__main__":
  config = tfdist.load_config()
  epochs = (with_loop if os.environ.get("LOOP") else with_fit)(config)
  if tfdist.is_chief(config):
    print("EPOCHS " + json.dumps(epochs), flush=True)
