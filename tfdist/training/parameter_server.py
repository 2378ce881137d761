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

import tfdist.progress as progress
from tfdist.errors import ConfigError, UnsupportedError
from tfdist.training import data, keras_fixes, py_datasets


def fit(model, strategy, train_data, y, *, batch_size: int | None, epochs: int,
        initial_epoch: int, steps_per_epoch: int | None, steps_per_execution: int,
        validation, callbacks, verbose="auto", source: str | None = None, report=None,
        service: str | None = None):
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
    report: called with (epoch, scalars) before the callbacks' epoch end: `worker_steps/<task>`
      (steps each worker completed), `epoch_retried_steps` (steps run again after a worker
      failed, counted on the ps) and `epoch_ps_round_trip_ms` (the median of 5 reads of a
      variable on the ps from the chief).
    service: the tf.data service's dispatcher a `tf.data.Dataset` is read through, as one
      endless stream of passes every worker shares (`data_service.reading.endless_passes`);
      None reads it on each worker.

  Returns:
    The Keras `History`.
  """
  if not steps_per_epoch:
    raise ConfigError("must be set under parameter_server: workers read endlessly repeated "
                      "data, so an epoch is a number of steps", key="training.steps_per_epoch", source=source)
  if data.is_generator(train_data) or py_datasets.is_py_dataset(train_data):
    raise data.DataError("train_data: parameter-server workers cannot run the chief's Python "
                         "(a generator or a keras.utils.PyDataset): pass a tf.data.Dataset "
                         "built from arrays or files, or a dataset function. Received: "
                         f"{'a generator' if data.is_generator(train_data) else 'a PyDataset'}")
  coordinator = coordinator_recording_progress(strategy)
  with strategy.scope():
    model._symbolic_build(data_batch=_one_batch(train_data, y, batch_size))
  keras_fixes.count_every_update(model)
  iterator = iter(coordinator.create_per_worker_dataset(
      _worker_dataset(train_data, y, strategy, batch_size, service)))
  with strategy.scope():  # On a ps: every attempt of a call adds its steps, retries included.
    attempted = tf.Variable(0, dtype=tf.int64, trainable=False, name="tfdist_attempted_steps")
  workers = strategy.extended._num_workers  # No public count; the resolver's is the same.
  tokens = _WorkerTokens(coordinator)
  train_function = _train_function(model, strategy, attempted)
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
    calls, done = [], [0] * workers
    attempted_before = int(attempted.numpy())
    for first in range(0, steps_per_epoch, steps_per_execution):
      steps = min(steps_per_execution, steps_per_epoch - first)
      calls.append((first + steps - 1, steps, coordinator.schedule(
          train_function, args=(iterator, tf.constant(steps, tf.int32), tokens.values))))
    for last_step, steps, call in calls:  # In order, as each finishes: the progress bar moves.
      callbacks.on_train_batch_begin(last_step)
      batch_logs, token = _fetch(call, logs)
      worker = None if token is None else tokens.worker(token)
      if worker is not None:
        done[worker] += steps
      callbacks.on_train_batch_end(last_step, batch_logs)
    with progress.collective(progress.Collective.COORDINATOR_JOIN):
      coordinator.join()  # Raises a call's error (a ps that died); a worker's is retried.
    logs = _floats(model.get_metrics_result())  # The whole epoch's, over every worker.
    if report is not None:
      retried = int(attempted.numpy()) - attempted_before - steps_per_epoch
      report(epoch, {**{f"worker_steps/worker-{i}": n for i, n in enumerate(done)},
                     "epoch_retried_steps": max(retried, 0),
                     "epoch_ps_round_trip_ms": _round_trip_ms(attempted)})
    if evaluate is not None:
      model.reset_metrics()
      logs.update({f"val_{k}": v for k, v in evaluate(validation).items()})
    callbacks.on_epoch_end(epoch, logs)
    if model.stop_training:
      break
  callbacks.on_train_end(logs)
  return model.history


def coordinator_recording_progress(strategy):
  """A `ClusterCoordinator` whose calls on each worker are recorded for the launcher's hang
  watch (`tfdist.progress.remote_call`): the worker holding a call that never ends is named,
  not the chief waiting for it. No public API tells which worker runs a call: each worker's
  thread runs its calls in `Worker._process_closure` (TensorFlow 2.19 to 2.21; a test in
  tests/test_hangs.py fails once it is gone)."""
  from tensorflow.python.distribute.coordinator import cluster_coordinator
  worker_class = cluster_coordinator.Worker
  if progress.watched() and not hasattr(worker_class, "_tfdist_recorded"):
    original = worker_class._process_closure

    def process_closure(worker, closure):
      progress.remote_call(worker.worker_index)
      try:
        return original(worker, closure)
      finally:
        progress.remote_call(worker.worker_index, finished=True)
    worker_class._process_closure = process_closure
    worker_class._tfdist_recorded = True
  return tf.distribute.coordinator.ClusterCoordinator(strategy)


def _fetch(call, previous: dict) -> tuple[dict, int | None]:
  """A call's logs (the running metrics) and the token of the worker that ran it; `previous`
  and None when the worker holding them died after the call finished (its steps are done; the
  coordinator reports real failures at `join`)."""
  try:
    logs, token = call.fetch()
    return _floats(logs), int(token)
  except tf.errors.UnavailableError:
    return previous, None


class _WorkerTokens:
  """Tells which worker ran a scheduled call.

  No public API tells a scheduled function its worker. Each worker draws a random token into a
  per-worker resource (the coordinator's private per-worker resources, which TensorFlow's own
  per-worker datasets use); a call returns its worker's token, and the chief maps tokens to
  workers by fetching the per-worker values, in worker order (again after a worker restarts
  and draws anew).
  """

  def __init__(self, coordinator):
    self.coordinator = coordinator
    self.values = coordinator._create_per_worker_resources(tf.function(
        lambda: tf.random.uniform([], maxval=2 ** 62, dtype=tf.int64)))
    self.workers = {}

  def worker(self, token) -> int | None:
    token = int(token)
    if token not in self.workers:
      fetched = self.coordinator.fetch(self.values._values)  # A tuple, in worker order.
      self.workers = {int(t): i for i, t in enumerate(fetched)}
    return self.workers.get(token)


def _round_trip_ms(variable, reads: int = 5) -> float:
  """The median time of reading `variable` (on a ps) from the chief, in ms."""
  times = []
  for _ in range(reads):
    start = time.perf_counter()
    variable.numpy()
    times.append(1000 * (time.perf_counter() - start))
  return sorted(times)[reads // 2]


def _floats(logs) -> dict:
  """`logs` as floats, nested dicts flattened as Keras's callbacks flatten them: a custom
  `train_step` returning `{m.name: m.result() for m in self.metrics}` (Keras's guide) nests the
  compiled metrics under "compile_metrics"."""
  flat = {}
  for key, value in logs.items():
    if isinstance(value, dict):
      flat.update(_floats(value))
    else:
      flat[key] = float(value)
  return flat


def _train_function(model, strategy, attempted):
  @tf.function
  def train(iterator, steps, token):
    attempted.assign_add(tf.cast(steps, tf.int64))
    logs = strategy.run(model.train_step, args=(next(iterator),))
    for _ in tf.range(steps - 1):
      logs = strategy.run(model.train_step, args=(next(iterator),))
    return logs, token
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


def explain_keras_calls(model) -> None:
  """Makes `model.predict` and `model.evaluate` (Keras's own) say in one line what to call
  instead: Keras 3 hands their dataset to a ParameterServerStrategy as is, and TensorFlow
  refuses it ("To use this dataset, you need to pass this dataset to
  ClusterCoordinator.create_per_worker_dataset"; keras-team/keras#18624). Only that error is
  translated; any other passes through."""
  for name in ("predict", "evaluate"):
    def call(*args, _keras=getattr(model, name), _name=name, **kwargs):
      try:
        return _keras(*args, **kwargs)
      except ValueError as e:
        if "ClusterCoordinator.create_per_worker_dataset" not in str(e):
          raise
        raise UnsupportedError(
            f"model.{_name} under parameter_server: Keras 3 cannot run it through TensorFlow's "
            f"ClusterCoordinator (keras-team/keras#18624); call tfdist.{_name}(model, x) "
            "instead, which runs it on the chief") from None
    object.__setattr__(model, name, call)  # This model only; Keras tracks no function.


def _one_batch(train_data, y, batch_size):
  """A batch of the training data, for Keras to build the model, metrics and optimizer."""
  if data.is_arrays(train_data):
    arrays = train_data if y is None else (train_data, y)
    return tf.nest.map_structure(lambda a: a[:batch_size], arrays)
  if data.is_dataset_fn(train_data):
    train_data = train_data(tf.distribute.InputContext())
  return next(iter(train_data))


def _worker_dataset(train_data, y, strategy, batch_size, service: str | None = None):
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
    if service:  # Made here; the coordinator rebuilds it on each worker from its graph.
      from tfdist.data_service import reading
      data.require_servable(train_data, "train_data")
      return reading.endless_passes(train_data, service=service)
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
