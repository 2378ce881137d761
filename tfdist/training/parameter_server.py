"""Parameter-server (asynchronous) training of a Keras 3 model: the `ClusterCoordinator` loop
Keras 3 dropped (keras-team/keras#18624), with Keras's callbacks, progress bar and `History`.

The chief (coordinator) schedules calls of a training function on the workers; each call runs
`steps_per_execution` Keras `train_step`s on its worker's own dataset and updates the variables
on the ps tasks without waiting for the other workers. At an epoch's end the chief waits for the
epoch's calls, reads the epoch's metrics from the ps and evaluates the validation data itself.
"""

from __future__ import annotations

import time

import keras
import tensorflow as tf

from tfdist.errors import ConfigError
from tfdist.training import data, keras_fixes


def fit(model, strategy, train_data, y, *, batch_size: int | None, epochs: int,
        initial_epoch: int, steps_per_epoch: int | None, steps_per_execution: int,
        validation, callbacks, verbose="auto", source: str | None = None):
  """Trains `model` (built and compiled in `strategy`'s scope) with a ClusterCoordinator.

  Args:
    model: the compiled model.
    strategy: the ParameterServerStrategy it was built under.
    train_data: numpy arrays, a `tf.data.Dataset` of batches, or a dataset function.
    y: targets of numpy `train_data`.
    batch_size: examples per step (one worker's batch).
    epochs: the epoch training ends before.
    initial_epoch: the epoch to start at (a resumed training's).
    steps_per_epoch: steps in an epoch, over all workers; required (the workers' data repeats).
    steps_per_execution: steps in one scheduled call.
    validation: a dataset the chief evaluates at each epoch's end, or None.
    callbacks: Keras callbacks.
    verbose: as for `Model.fit`.
    source: the config's source, for errors.

  Returns:
    The Keras `History`.
  """
  if not steps_per_epoch:
    raise ConfigError("must be set under parameter_server: workers read endlessly repeated "
                      "data, so an epoch is a number of steps", key="training.steps_per_epoch",
                      received=None, source=source)
  if data.is_generator(train_data):
    raise data.DataError("train_data: parameter-server workers cannot run a Python generator "
                         "of the chief: pass a tf.data.Dataset built from arrays or files, or a "
                         "dataset function. Received: a generator")
  coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
  with strategy.scope():
    model._symbolic_build(data_batch=_one_batch(train_data, y, batch_size))
  keras_fixes.count_every_update(model)
  iterator = iter(coordinator.create_per_worker_dataset(
      _worker_dataset(train_data, y, strategy, batch_size)))
  train_function = _train_function(model, strategy)
  evaluate = _evaluate_function(model) if validation is not None else None

  callbacks = keras.callbacks.CallbackList(
      callbacks, add_history=True, add_progbar=verbose != 0, model=model,
      verbose=1 if verbose == "auto" else verbose, epochs=epochs, steps=steps_per_epoch)
  model.stop_training = False
  callbacks.on_train_begin()
  logs = {}
  for epoch in range(initial_epoch, epochs):
    model.reset_metrics()
    callbacks.on_epoch_begin(epoch)
    calls = []
    for first in range(0, steps_per_epoch, steps_per_execution):
      steps = min(steps_per_execution, steps_per_epoch - first)
      calls.append((first + steps - 1, coordinator.schedule(
          train_function, args=(iterator, tf.constant(steps, tf.int32)))))
    for last_step, call in calls:  # In order, as each finishes: the progress bar moves.
      callbacks.on_train_batch_begin(last_step)
      callbacks.on_train_batch_end(last_step, _fetch(call, logs))
    coordinator.join()  # Raises a call's error (a ps that died); a worker's is retried.
    logs = _floats(model.get_metrics_result())  # The whole epoch's, over every worker.
    if evaluate is not None:
      model.reset_metrics()
      logs.update({f"val_{k}": v for k, v in evaluate(validation).items()})
    callbacks.on_epoch_end(epoch, logs)
    if model.stop_training:
      break
  callbacks.on_train_end(logs)
  return model.history


def _fetch(call, previous: dict) -> dict:
  """A call's logs (the running metrics); `previous` when the worker holding them died after
  the call finished (its steps are done; the coordinator reports real failures at `join`)."""
  try:
    return _floats(call.fetch())
  except tf.errors.UnavailableError:
    return previous


def _floats(logs) -> dict:
  return {k: float(v) for k, v in logs.items()}


def _train_function(model, strategy):
  @tf.function
  def train(iterator, steps):
    logs = strategy.run(model.train_step, args=(next(iterator),))
    for _ in tf.range(steps - 1):
      logs = strategy.run(model.train_step, args=(next(iterator),))
    return logs
  return train


def _evaluate_function(model):
  """Evaluation on the chief itself: its own pass over the data, reading the variables from
  the ps, every example once."""
  @tf.function
  def step(batch):
    return model.test_step(batch)

  def evaluate(dataset):
    logs = {}
    for batch in dataset:
      logs = step(batch)
    return _floats(logs)
  return evaluate


def evaluate(model, dataset, *, return_dict: bool = False, verbose=None):
  """`Model.evaluate` of a parameter-server model (Keras's fails there): on the chief, in the
  order Keras returns its results."""
  del verbose
  model.reset_metrics()
  logs = _evaluate_function(model)(dataset)
  if return_dict:
    return logs
  return next(iter(logs.values())) if len(logs) == 1 else list(logs.values())


def predict(model, dataset, *, verbose=None):
  """`Model.predict` of a parameter-server model (Keras's fails there): on the chief, outputs in
  input order."""
  del verbose
  step = tf.function(model.predict_step)
  outputs = [step(batch) for batch in dataset]
  return tf.nest.map_structure(lambda *parts: tf.concat(parts, axis=0).numpy(), *outputs)


def _one_batch(train_data, y, batch_size):
  """A batch of the training data, for Keras to build the model, metrics and optimizer."""
  if data.is_arrays(train_data):
    arrays = train_data if y is None else (train_data, y)
    return tf.nest.map_structure(lambda a: a[:batch_size], arrays)
  if data.is_dataset_fn(train_data):
    train_data = train_data(tf.distribute.InputContext())
  return next(iter(train_data))


def _worker_dataset(train_data, y, strategy, batch_size):
  """What each worker reads: its own endless stream of batches (a dataset function, or a
  dataset the coordinator rebuilds on each worker; a dataset made on the chief cannot be sent).

  numpy arrays are shuffled with a seed each worker draws when its dataset is made, so the
  workers do not read in lockstep (visitation is random, as TensorFlow's parameter-server guide
  has it, not exactly once per epoch).
  """
  if data.is_dataset_fn(train_data):
    return lambda: strategy.distribute_datasets_from_function(
        lambda context: train_data(context).repeat())
  if isinstance(train_data, tf.data.Dataset):
    data.require_batched_by(train_data, batch_size, "train_data")
    data.require_serializable(train_data, "train_data")
    return train_data.repeat()  # The coordinator rebuilds it on each worker from its graph.
  data.require_batch_size(batch_size, "train_data")
  arrays = train_data if y is None else (train_data, y)
  count = len(tf.nest.flatten(arrays)[0])

  def worker_dataset():
    seed = tf.cast(tf.timestamp() * 1e6, tf.int64)  # Drawn on the worker, when it starts.
    return (tf.data.Dataset.from_tensor_slices(arrays)
            .shuffle(count, seed=seed, reshuffle_each_iteration=True).repeat()
            .batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE))
  return worker_dataset
