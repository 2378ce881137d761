"""What a Keras user brings, as a script: Keras's everyday fit arguments (weights on arrays,
a dataset and a generator too), a Metric subclass of
their own beside Keras's stateful AUC, Keras's own evaluate and predict on the model tfdist
returns, a seeded dataset shuffle, a model of two inputs given as a list, and a model with its
own `train_step` and `test_step` as Keras's "Customizing what happens in fit()" guide writes
them, a `keras.utils.PyDataset` (fit shuffling its batches, its
validation data and an evaluate; the model's optimizer clipping and averaging its weights), and the transfer-learning guide's two phases (a frozen base trained under
EarlyStopping, then unfrozen, compiled again with a new optimizer and metric made outside any
scope, and trained by Keras's own fit). `python keras_contract.py plain` trains with plain
Keras on one device (no tfdist); `python keras_contract.py tfdist [CASE...]` with `tfdist.fit` under
the launched config (the cases named, or all). Each prints one
`RESULT <case> <json>` line per case (the chief's, or each task's alike)."""

import json
import sys

import numpy as np

if sys.argv[1] == "tfdist":
  import tfdist  # First: a launched task's strategy before TensorFlow starts.
import keras
import tensorflow as tf

from tests.programs.user_metrics import MeanMargin, RowsSeen
from tests.programs.user_models import GuidesOwnStep

ROWS, BATCH, EPOCHS = 256, 32, 3
rng = np.random.default_rng(5)
X = rng.normal(size=(ROWS, 8)).astype("float32")
Y = (X[:, :4].sum(axis=1) > 0).astype("float32")[:, None]
W = rng.uniform(0.2, 2.0, size=ROWS).astype("float32")


def make_two_inputs():
  """The model over two inputs of 4 features each, given as a list `[x1, x2]` as Keras's
  functional guide passes several inputs."""
  init = keras.initializers.GlorotUniform(seed=3)
  first, second = keras.Input((4,)), keras.Input((4,))
  joined = keras.layers.Concatenate()([first, second])
  hidden = keras.layers.Dense(16, "relu", kernel_initializer=init)(joined)
  model = keras.Model([first, second], keras.layers.Dense(1, kernel_initializer=init)(hidden))
  model.compile(optimizer=keras.optimizers.SGD(0.05),
                loss=keras.losses.BinaryCrossentropy(from_logits=True),
                metrics=[keras.metrics.BinaryAccuracy(threshold=0.0), RowsSeen()])
  return model


TWO = [X[:, :4], X[:, 4:]]
TWO_FIT = dict(batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, validation_split=0.25)


def report_two_inputs(history, model):
  report("several_inputs", history, model,
         evaluate=model.evaluate(TWO, Y, batch_size=BATCH, verbose=0),
         predict=model.predict(TWO, batch_size=BATCH, verbose=0).tolist(),
         train_on_batch=model.train_on_batch([t[:BATCH] for t in TWO], Y[:BATCH]),
         predict_on_batch=model.predict_on_batch([t[:BATCH] for t in TWO]).tolist())


def make_model(own_step=False, optimizer=None):
  init = keras.initializers.GlorotUniform(seed=3)
  layers = [keras.layers.Dense(16, "relu", kernel_initializer=init),
            keras.layers.Dense(1, kernel_initializer=init)]
  if own_step:
    inputs = keras.Input((8,))
    model = GuidesOwnStep(inputs, layers[1](layers[0](inputs)))
  else:
    model = keras.Sequential([keras.Input((8,)), *layers])
  model.compile(optimizer=optimizer or keras.optimizers.SGD(0.05),
                loss=keras.losses.BinaryCrossentropy(from_logits=True),
                metrics=[keras.metrics.BinaryAccuracy(threshold=0.0), RowsSeen(), MeanMargin(),
                         keras.metrics.AUC(from_logits=True, name="auc")])
  return model


def make_frozen_base():
  """Keras's transfer-learning guide: a base frozen (called with training=False) under a new
  head."""
  init = keras.initializers.GlorotUniform(seed=3)
  base = keras.Sequential([keras.Input((8,)),
                           keras.layers.Dense(16, "relu", kernel_initializer=init),
                           keras.layers.LayerNormalization(),
                           keras.layers.Dense(8, "relu", kernel_initializer=init)], name="base")
  base.trainable = False
  inputs = keras.Input((8,))
  model = keras.Model(inputs, keras.layers.Dense(1, kernel_initializer=init)(
      base(inputs, training=False)))
  model.compile(**fine_tuning_compile(1e-2))
  return model


def fine_tuning_compile(learning_rate):
  return dict(optimizer=keras.optimizers.Adam(learning_rate),
              loss=keras.losses.BinaryCrossentropy(from_logits=True),
              metrics=[keras.metrics.BinaryAccuracy(threshold=0.0)])


def fine_tune(history, model):
  """The guide's second phase on the model the first gave: the base unfrozen, compiled again
  (an optimizer and a metric made here, outside any strategy's scope), Keras's own fit."""
  model.get_layer("base").trainable = True
  model.compile(**fine_tuning_compile(1e-4))
  second = model.fit(X, Y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
  report("fine_tuning", history, model,
         second=[second.history["loss"], second.history["binary_accuracy"]],
         evaluate=model.evaluate(X, Y, batch_size=BATCH, verbose=0))


STOP = dict(monitor="loss", patience=1, restore_best_weights=True)


FIT_CASES = {
    "validation_split": dict(validation_split=0.25),
    "sample_weight": dict(sample_weight=W),
    "class_weight": dict(class_weight={0: 1.0, 1: 3.0}),
    "initial_epoch": dict(initial_epoch=1),
    "validation_steps": dict(validation_data=(X[:96], Y[:96]), validation_steps=2),
}


def batches_of(*arrays):
  return tf.data.Dataset.from_tensor_slices(arrays).batch(BATCH)


# Keras's weights on the other input kinds: a dataset's own (x, y, sample_weight) batches, and
# class_weight beside a dataset. A generator's class_weight is tests/test_keras_arguments.py's
# (one process): on 2 workers a generator's epochs 2-3 differed from one device in 1 of 4
# suite runs (BUILD_NOTES.md, Known limits), as with sample weights before.
KIND_CASES = {
    "sample_weight_dataset": (lambda: batches_of(X, Y, W), {}),
    "class_weight_dataset": (lambda: batches_of(X, Y), FIT_CASES["class_weight"]),
}


def shuffled():
  """A seeded shuffle, made before any training as a script makes it."""
  return tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(ROWS, seed=9).batch(BATCH)


class Batches(keras.utils.PyDataset):
  """A user's PyDataset as Keras's docs write one: batches by index, read by 2 threads, its own
  order reshuffled (seeded) at each epoch's end, a sample weight as the third element. A plain
  run replays the order tfdist documents for fit's shuffle, epoch e's batches in
  `default_rng([training.seed or 0, e]).permutation(batches)`: the same on every worker."""

  def __init__(self, rows, epoch_orders=False):
    # The plain reference's batches depend on the epoch: read in Keras's main thread, as its
    # 2 threads raced `on_epoch_begin` at an epoch's start (1 of 3 plain runs differed).
    super().__init__(workers=1 if epoch_orders else 2)
    self.rows, self.order = rows, np.arange(len(rows))
    self.rng, self.epoch_orders, self.epoch = np.random.default_rng(11), epoch_orders, -1
    self.hooks = []

  def __len__(self):
    return len(self.rows) // BATCH

  def on_epoch_begin(self):
    self.epoch += 1
    self.hooks.append("begin")

  def on_epoch_end(self):
    self.rng.shuffle(self.order)
    self.hooks.append("end")

  def __getitem__(self, index):
    if self.epoch_orders:  # Plain Keras, fed the batches in tfdist's documented order.
      index = np.random.default_rng([0, max(self.epoch, 0)]).permutation(len(self))[index]
    rows = self.rows[self.order[index * BATCH:(index + 1) * BATCH]]
    return X[rows], Y[rows], W[rows]


def clipped_averaged():
  """The py_dataset case's model: an optimizer clipping by norm, its weights overwritten by
  their moving averages every 3 steps (Keras's optimizer arguments)."""
  return make_model(optimizer=keras.optimizers.Adam(0.01, clipnorm=0.05, use_ema=True,
                                                    ema_overwrite_frequency=3))


def py_datasets(epoch_orders=False):
  """A PyDataset to train on (shuffled by fit), one to validate on, one to evaluate."""
  return (Batches(np.arange(ROWS), epoch_orders), Batches(np.arange(96)),
          Batches(np.arange(ROWS)[::-1]))


def report_py_dataset(history, model, train, validation, evaluated):
  report("py_dataset", history, model, hooks=[train.hooks, validation.hooks, evaluated.hooks],
         evaluate=evaluated.result)


def report(case, history, model, **more):
  print("RESULT", case, json.dumps({
      "history": history.history, "epoch": history.epoch,
      "weights": [w.tolist() for w in model.get_weights()], **more}), flush=True)


GUIDES = dict(batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
              validation_data=(X[:96], Y[:96]))


def plain():
  dataset = shuffled()
  for case, kwargs in FIT_CASES.items():
    model = make_model()
    report(case, model.fit(X, Y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                           **kwargs), model)
  for case, (_, kwargs) in KIND_CASES.items():
    model = make_model()
    data = batches_of(X, Y, W) if case.startswith("sample") else batches_of(X, Y)
    report(case, model.fit(data, epochs=EPOCHS, verbose=0, **kwargs), model)
  model = make_two_inputs()
  report_two_inputs(model.fit(TWO, Y, **TWO_FIT), model)
  model = make_model(own_step=True)
  history = model.fit(X, Y, **GUIDES)
  report("guides_train_step", history, model,
         evaluate=model.evaluate(X, Y, batch_size=BATCH, verbose=0))
  model = make_model()
  report("shuffled_dataset", model.fit(dataset, epochs=EPOCHS, verbose=0), model)
  keras_methods(model)
  model = clipped_averaged()
  train, validation, evaluated = py_datasets(epoch_orders=True)
  history = model.fit(train, epochs=EPOCHS, shuffle=False, verbose=0, validation_data=validation)
  evaluated.result = model.evaluate(evaluated, verbose=0)
  report_py_dataset(history, model, train, validation, evaluated)
  model = make_frozen_base()
  fine_tune(model.fit(X, Y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                      callbacks=[keras.callbacks.EarlyStopping(**STOP)]), model)


def distributed(only=()):
  """Each case through `tfdist.fit` under the launched config; `only`: those cases alone."""
  def wanted(case):
    return not only or case in only
  dataset = shuffled()
  for case, kwargs in FIT_CASES.items():
    if wanted(case):
      history = tfdist.fit(make_model, X, Y, batch_size=BATCH, epochs=EPOCHS, shuffle=False,
                           verbose=0, **kwargs)
      report(case, history, history.model)
  for case, (data, kwargs) in KIND_CASES.items():
    if wanted(case):
      history = tfdist.fit(make_model, data(), epochs=EPOCHS, steps_per_epoch=ROWS // BATCH,
                           verbose=0, **kwargs)
      report(case, history, history.model)
  if wanted("several_inputs"):
    history = tfdist.fit(make_two_inputs, TWO, Y, **TWO_FIT)
    report_two_inputs(history, history.model)
  if wanted("guides_train_step"):
    history = tfdist.fit(lambda: make_model(own_step=True), X, Y, **GUIDES)
    report("guides_train_step", history, history.model,
           evaluate=history.model.evaluate(X, Y, batch_size=BATCH, verbose=0))
  if wanted("shuffled_dataset") or wanted("keras_methods"):
    history = tfdist.fit(make_model, dataset, epochs=EPOCHS, verbose=0)
    if wanted("shuffled_dataset"):
      report("shuffled_dataset", history, history.model)
    if wanted("keras_methods"):
      keras_methods(history.model)  # Keras's own methods on it.
  if wanted("py_dataset"):
    train, validation, evaluated = py_datasets()
    history = tfdist.fit(clipped_averaged, train, epochs=EPOCHS, verbose=0,
                         validation_data=validation)
    evaluated.result = tfdist.evaluate(history.model, evaluated)
    report_py_dataset(history, history.model, train, validation, evaluated)
  if wanted("fine_tuning"):
    history = tfdist.fit(make_frozen_base, X, Y, batch_size=BATCH, epochs=EPOCHS,
                         shuffle=False, verbose=0,
                         callbacks=[keras.callbacks.EarlyStopping(**STOP)])
    fine_tune(history, history.model)


def keras_methods(model):
  """Keras's evaluate, predict and its *_on_batch methods (a batch of BATCH rows)."""
  print("RESULT keras_methods", json.dumps({
      "evaluate": model.evaluate(X, Y, batch_size=BATCH, verbose=0),
      "predict": model.predict(X, batch_size=BATCH, verbose=0).tolist(),
      "train_on_batch": model.train_on_batch(X[:BATCH], Y[:BATCH], sample_weight=W[:BATCH]),
      "test_on_batch": model.test_on_batch(X[BATCH:2 * BATCH], Y[BATCH:2 * BATCH]),
      "predict_on_batch": model.predict_on_batch(X[:BATCH]).tolist()}), flush=True)


if __name__ == "__main__":
  plain() if sys.argv[1] == "plain" else distributed(sys.argv[2:])
