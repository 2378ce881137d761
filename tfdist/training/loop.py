"""`tfdist.TrainingLoop`: a user's own training loop (a `train_step` with `tf.GradientTape`)
distributed without rewriting it, under every strategy.

The step is written as for one device: its loss a mean over its batch, `tape.gradient`,
`optimizer.apply_gradients`, Keras metrics updated. The loop runs it on every replica
(`strategy.run`) inside one compiled function of `training.steps_per_execution` steps, with
one device's arithmetic (`replica_math`: each replica's gradients weighted by its share of the
global batch before the all-reduce; Keras's per-replica loss scaling off), and returns what the
step returned combined as one device's: a scalar (a mean over the replica's examples) by the
replicas' shares, a tensor of rows gathered in input order. Under parameter_server the calls
are scheduled on the workers by a `ClusterCoordinator` (variables on the ps).

```python
loop = tfdist.TrainingLoop()                       # the launcher's config, or a path / dict
with loop.scope():
  model, optimizer = make_model(), keras.optimizers.Adam(1e-3)
  accuracy = keras.metrics.SparseCategoricalAccuracy()
loop.prepare(model, optimizer, accuracy)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

def train_step(x, y):                              # as for one device
  with tf.GradientTape() as tape:
    logits = model(x, training=True)
    loss = loss_fn(y, logits) + sum(model.losses)
  optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                model.trainable_variables))
  accuracy.update_state(y, logits)
  return {"loss": loss}

dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(loop.global_batch_size)
for epoch in loop.epochs(5):                       # resumes where a restarted run left off
  for logs in loop.run(train_step, dataset):       # one dict per step
    pass
  loop.print(f"epoch {epoch}: loss {logs['loss']:.4f} accuracy {accuracy.result():.4f}")
  accuracy.reset_state()
```
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
from typing import Callable, Iterator

import keras
import numpy as np
import tensorflow as tf

import tfdist.progress as progress
from tfdist.config import strategies
from tfdist.config.loader import FRESH_ENV
from tfdist.config.roles import is_chief
from tfdist.errors import ConfigError
from tfdist.config.loader import ConfigLike, as_config
from tfdist.data_service import reading
from tfdist.strategy.factory import make_strategy
from tfdist.machine import precision
from tfdist.training import (checkpoints, data, dtype_policy, keras_fixes, replica_math,
                             report, settings, sharded_parameters, user_files)


class TrainingLoop:
  """Runs a user's step function on every replica of the config's strategy.

  Args:
    config: a `Config`, a YAML path or a mapping; None reads TFDIST_CONFIG/TF_CONFIG (what
      `tfdist launch` gives each task) and means one device when neither is set.

  Attributes:
    strategy: the `tf.distribute` strategy (made from the config).
    global_batch_size: examples per step over every replica (`training.global_batch_size`, or
      the per-replica size times the replicas); None when the config gives neither.
    is_chief: whether this task writes checkpoints and prints (`print`).
    step: optimizer steps run so far (restored with a checkpoint).

  Example:

  ```python
  import keras
  import numpy as np
  import tensorflow as tf
  import tfdist
  x = np.random.rand(256, 8).astype("float32")
  y = np.random.randint(0, 3, 256)
  loop = tfdist.TrainingLoop({"strategy": {"name": "mirrored"},
                              "devices": {"logical_cpus": 2},
                              "training": {"global_batch_size": 32}})
  with loop.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
    optimizer = keras.optimizers.Adam(1e-3)
  loop.prepare(model, optimizer)
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  def train_step(x, y):   # as for one device
    with tf.GradientTape() as tape:
      loss = loss_fn(y, model(x, training=True))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                  model.trainable_variables))
    return {"loss": loss}

  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(loop.global_batch_size)
  for epoch in loop.epochs(2):
    for logs in loop.run(train_step, dataset):
      pass
    loop.print(f"epoch {epoch}: loss {logs['loss']:.4f}")
  ```
  """

  def __init__(self, config: ConfigLike = None):
    self.config = as_config(config)
    self._paths = settings.paths_of(self.config, settings.LOOP)
    settings.refuse_keras_distribution(self._paths)
    settings.refuse_unhonoured(self.config, self._paths)
    self._lease = settings.hold_checkpoint_dir(self.config)  # Released when the epochs end.
    self.strategy = make_strategy(self.config)
    keras_fixes.install()  # Keras's own methods of models built in the loop's scope, fixed.
    user_files.checkpoints_on_chief_only(self.config)  # A script's own tf.train.Checkpoint.
    self._seeded = settings.seed(self.config)  # No arrays to shuffle: the user's dataset is.
    self.asynchronous = strategies.kind(self.config.strategy.name).asynchronous
    self.replicas = self.strategy.num_replicas_in_sync
    self.global_batch_size = settings.global_batch(self.config, self.replicas)
    self.is_chief = is_chief(self.config)
    self.precision = settings.precision(self.config)
    self._built_with = settings.given_back_policy(self.precision)
    self._notice = settings.preemption_notice(self.config, self.strategy)
    self._cadence = settings.backup_cadence(self.config, self.strategy)
    self._steps_per_call = settings.steps_per_execution(self.config)
    self._averaging, self._accumulation = None, 1  # From the optimizers prepared.
    self._fused, self._sharded, self._announced, self._listening = None, None, False, False
    self.step = 0
    self._epoch, self._steps_into_epoch, self._resume_skip = 0, 0, 0
    self._tracked: dict[str, object] = {}
    self._compiled: dict[int, Callable] = {}
    self._coordinator, self._worker_iterators, self._streams = None, {}, {}
    self._service, self._served = settings.data_service(self.config), {}
    self._synced: list[_SyncedMetric] = []  # Metrics read without a collective between runs.
    self._files = contextlib.ExitStack()  # A non-chief task's scratch folder for its saves.
    self._manager: tf.train.CheckpointManager | None = None
    self._within_epochs = False

  def _announce(self) -> None:
    """The chief's start line, once, when training starts (the optimizer's settings known)."""
    if self._announced or not self.is_chief:
      return
    self._announced = True
    report.say(report.choices_line(
        strategy_name=self.config.strategy.name, replicas=self.replicas,
        global_batch=self.global_batch_size, precision=self.precision,
        steps_per_execution=self._steps_per_call, fused=self._fused,
        accumulation=self._accumulation, seed_note=self._seeded.note,
        sharded=self._sharded, data_workers=self.config.cluster.data_worker if self._service
        else 0, passes=self.config.data_service.passes))

  @contextlib.contextmanager
  def scope(self):
    """The strategy's scope: build the model, optimizer and metrics inside it. Layers made
    inside compute in the config's `training.mixed_precision` (what `auto` measured here);
    `prepare` keeps a model's output layers float32."""
    with self.strategy.scope(), dtype_policy.building_with(self.precision.policy):
      yield

  def prepare(self, *objects):
    """Readies what the step uses: an optimizer is built on the models' variables in the scope
    (Keras builds it lazily, inside the first traced step, which tf.distribute refuses) and
    weights each replica's gradients by its share of the global batch; a metric counts every
    replica's updates (keras#21054 under central_storage; parameter_server's asynchronous
    workers); models and optimizers go into the loop's checkpoint.

    Args:
      *objects: Keras models, optimizers and metrics, in any order (an optimizer is built on
        the models prepared with it).

    Returns:
      The objects, unchanged in identity (one object alone, else a tuple).

    Raises:
      TypeError: an object of another kind.
      ValueError: an optimizer without built models before it; a model not built yet.
      ModelError: a model built outside `scope()`.
    """
    from tfdist.training import in_scope
    models = [o for o in objects if isinstance(o, keras.Model)]
    for model in models:
      if not model.built:
        raise ValueError(f"loop.prepare: model {model.name!r} is not built yet (a Sequential "
                         "without keras.Input builds at its first call), so the optimizer has "
                         "no weights to be built on: start it with keras.Input(shape), or call "
                         "model.build((None, ...)) inside loop.scope() first")
    in_scope.require_built_in_scope(self.strategy, models, "loop.prepare",
                                    "build it inside `with loop.scope():`")
    for obj in objects:
      if isinstance(obj, keras.Model):
        dtype_policy.keep_outputs_float32(obj)
        self._tracked[f"model_{len(self._tracked)}"] = obj
      elif isinstance(obj, keras.optimizers.Optimizer):
        self._prepare_optimizer(obj, models)
      elif isinstance(obj, keras.metrics.Metric):
        if keras_fixes.counts_replicas_wrong(self.strategy) or self.asynchronous:
          keras_fixes.sum_deltas(obj.variables)
        if keras_fixes.in_multi_worker_mode(self.strategy):
          self._synced.append(_SyncedMetric(obj))
      else:
        raise TypeError("loop.prepare takes Keras models, optimizers and metrics. "
                        f"Received: {type(obj).__name__}")
    return objects[0] if len(objects) == 1 else objects

  def _prepare_optimizer(self, optimizer, models) -> None:
    inner = getattr(optimizer, "inner_optimizer", optimizer)  # Under loss scaling.
    if self.precision.policy == precision.FLOAT16 and inner is optimizer:
      raise ConfigError("is float16 here: wrap the optimizer in "
                        "keras.optimizers.LossScaleOptimizer and call optimizer.scale_loss(loss) "
                        "before tape.gradient, as on one device (or use bfloat16 or off)",
                        key="training.mixed_precision", received=type(optimizer).__name__,
                        source=self.config.source)
    variables = [v for m in models for v in m.trainable_variables]
    # Before the build (Keras makes the accumulators then); periodic averaging's own gradients
    # before the share weighting, which wraps it.
    installed = settings.install_on_optimizer(optimizer, self.strategy, self.config,
                                              self._paths)
    self._fused = installed.fused or self._fused
    self._accumulation = installed.accumulation
    self._averaging = self._averaging or installed.averaging  # One over every model.
    # The loop learns an epoch's length only when it runs: a warm-up needs the config's.
    settings.learning_rate_schedule(optimizer, self.config, self.replicas,
                                    settings.steps_per_epoch(self.config))
    if not optimizer.built:
      if not variables:
        raise ValueError("loop.prepare needs the built models an optimizer updates before it: "
                         f"loop.prepare(model, optimizer). Received: {type(optimizer).__name__} "
                         "alone")
      with self.scope():
        optimizer.build(variables)
    replica_math.weight_gradients_by_share(inner)
    settings.shard_parameters(models, optimizer, self.strategy, self.config)
    self._sharded = sharded_parameters.describe_sharding(optimizer, variables, models) or \
        self._sharded
    if self.asynchronous:
      keras_fixes.sum_deltas([optimizer.iterations])
    self._tracked[f"optimizer_{len(self._tracked)}"] = optimizer

  def run(self, step_fn: Callable, dataset: tf.data.Dataset, *, steps: int | None = None
          ) -> Iterator[dict]:
    """Runs `step_fn` over `dataset` for one epoch (or `steps` steps, under every strategy),
    yielding what it returned at each step, combined over the replicas (the steps run in
    compiled calls of `training.steps_per_execution`). A dataset of known length is read as one stream of epochs (repeated, one
    iterator across runs, a reshuffling `shuffle` reshuffled each epoch): each run takes its
    next `steps` batches, one epoch by default.

    Args:
      step_fn: the step, written for one device: called with a batch's elements (`step(x, y)`
        for `(x, y)` batches), returns a scalar, a tensor of rows, or a dict of them. A
        `tf.function` is run as its Python function (nesting it breaks collectives,
        keras#19246).
      dataset: a `tf.data.Dataset` batched by `global_batch_size`.
      steps: steps to run; default `training.steps_per_epoch`, else the dataset's (one
        epoch; required under parameter_server when neither is known).

    Yields:
      A dict of numpy values for every step run, in order (a step returning one value:
      `{"output": value}`): a scalar as one device's (the replicas' values weighted by their
      examples), a tensor's rows gathered in input order. A running mean over what it yields
      is a mean over steps, as in TensorFlow's custom-training tutorials.

    Raises:
      DataError: `dataset` is not a `tf.data.Dataset`.
      ConfigError: the dataset is batched by another size than `global_batch_size`; or, under
        parameter_server, neither `steps` nor the dataset's length is known.
    """
    if not isinstance(dataset, tf.data.Dataset):
      raise data.DataError("dataset: TrainingLoop.run reads a tf.data.Dataset of global "
                           "batches (arrays: tf.data.Dataset.from_tensor_slices(...).batch("
                           "loop.global_batch_size); a keras.utils.PyDataset: tfdist.fit). "
                           f"Received: {type(dataset).__name__}")
    data.require_batched(dataset, "dataset")
    data.require_batched_by(dataset, self.global_batch_size, "dataset")
    if self.global_batch_size is None:  # The config gives none: the dataset's own batch.
      self.global_batch_size = data.batched_by(dataset)
      if self.global_batch_size is None and self.replicas > 1:
        raise ConfigError("is needed to weigh each replica's share of a batch: set it, or "
                          "batch the dataset with a known size", key="training.global_batch_size", source=self.config.source)
    step_fn = getattr(step_fn, "python_function", step_fn)
    steps = settings.steps_per_epoch(self.config, steps)
    if self.asynchronous:
      yield from self._run_on_workers(step_fn, dataset, steps)
      return
    skip, self._resume_skip = self._resume_skip, 0
    self._steps_into_epoch = skip  # Each run is an epoch from its start (or the resumed step).
    length = _length(dataset)
    if self._service:  # A new pass of the tf.data service's for each run (a resumed one too).
      steps = steps - skip if steps and skip else steps
      iterator = iter(self._served_pass(dataset))
    elif length:  # One endless stream of epochs, one iterator, as tfdist.fit reads a dataset.
      steps = (steps or length) - skip
      iterator = self._stream(dataset, skip)
    else:  # Unknown length: a pass until the data ends.
      iterator = self._iterator(dataset.skip(skip) if skip else dataset)
    call = self._call(step_fn)
    done = 0
    for metric in self._synced:
      metric.thaw()
    while steps is None or done < steps:
      count = self._steps_per_call
      count = count if steps is None else min(count, steps - done)
      progress.begin_call(self._epoch, self._steps_into_epoch)
      try:
        with replica_math.unscaled_keras_losses(), (
            reading.dispatcher_restarts_explained() if self._service
            else contextlib.nullcontext()):
          scalars, tensors, ran = call(iterator, tf.constant(count))
      except (StopIteration, tf.errors.OutOfRangeError):
        progress.finish_call(where=_OWN_LOOP)
        break
      progress.finish_call(self._steps_into_epoch + int(ran), _OWN_LOOP)
      done += int(ran)
      # The run's last call ends the epoch under `epochs`, whose checkpoint follows at once.
      self._after_call(int(ran), epoch_ends=self._within_epochs and (
          int(ran) < count or (steps is not None and done >= steps)))
      yield from _each_step(_numpy(scalars), _numpy(tensors), int(ran))
      if int(ran) < count:
        break
    for metric in self._synced:  # Every worker, in the same order: one all-reduce each.
      metric.freeze()

  def _served_pass(self, dataset):
    """`dataset` read through the tf.data service (`tfdist.data_service.reading`): registered
    once, a new pass shared by every worker each time it is iterated."""
    from tfdist.training import agreement
    if id(dataset) not in self._served or self._served[id(dataset)][0] is not dataset:
      data.require_servable(dataset, "dataset")
      token = agreement.agreed_token(self.strategy, progress.Collective.DATA_SERVICE_NAME)
      self._served[id(dataset)] = (dataset, reading.served(
          dataset, strategy=self.strategy, service=self._service,
          global_batch=self.global_batch_size, token=token, then=data.counted,
          passes=self.config.data_service.passes))
    return self._served[id(dataset)][1]

  def _iterator(self, dataset):
    # The default strategy has nothing to distribute, and its distributed dataset (an extra
    # prefetch) measured 13-14k samples/s in the compiled loop against 25k for the dataset.
    dataset = data.counted(dataset)  # The launcher's hang watch: batches drawn.
    return iter(dataset if self.strategy is tf.distribute.get_strategy() else
                self.strategy.experimental_distribute_dataset(data.with_shard_policy(dataset)))

  def _stream(self, dataset, skip: int):
    """The iterator of `dataset` repeated without end (kept across runs: a new iterator each
    epoch measured up to 2x slower, and a finite multi-worker dataset all-reduces "has data" in
    every step), from its `skip`-th batch after a resume."""
    cached = self._streams.get(id(dataset))
    if cached is None or cached[0] is not dataset or skip:
      stream = dataset.skip(skip).concatenate(dataset.repeat()) if skip else dataset.repeat()
      cached = self._streams[id(dataset)] = (dataset, self._iterator(stream))
    return cached[1]

  def _call(self, step_fn):
    """The compiled function running up to `count` steps of `step_fn` from a distributed
    iterator: (every step's scalars stacked, every step's tensors with their row counts, the
    steps run)."""
    if id(step_fn) in self._compiled:
      return self._compiled[id(step_fn)]
    strategy, global_batch = self.strategy, self.global_batch_size
    scalar_keys = []  # Known once the step is traced.
    if settings.jit_compile(self.config):  # One replica (config.honoured): Keras compiles its
      step_fn = tf.function(step_fn, jit_compile=True)  # step so, inside the loop of steps.

    def one(batch):
      def replica(batch):
        if strategy.num_replicas_in_sync == 1:  # One device's arithmetic already.
          return _as_dict(step_fn(*_arguments(batch, step_fn)))
        outputs, _ = replica_math.with_share(batch, global_batch,
                                             lambda: step_fn(*_arguments(batch, step_fn)))
        outputs = _as_dict(outputs)
        scalar_keys[:] = [k for k, v in outputs.items() if _is_scalar(v)]
        examples = tf.cast(replica_math.rows(batch), tf.float32)
        packed = tf.stack([tf.cast(outputs.pop(k), tf.float32) * examples
                           for k in scalar_keys] + [examples])
        return {**outputs, _PACKED: packed}
      outputs = strategy.run(replica, args=(batch,))
      if strategy.num_replicas_in_sync == 1:
        return {k: strategy.experimental_local_results(v)[0] for k, v in outputs.items()}
      # Each scalar (a mean over its replica's examples) weighted by the replica's examples:
      # one all-reduce for every scalar of the step, then the global mean.
      packed = strategy.reduce("SUM", outputs.pop(_PACKED), axis=None)
      combined = {k: packed[i] / packed[-1] for i, k in enumerate(scalar_keys)}
      combined.update({k: strategy.gather(v, axis=0) for k, v in outputs.items()})
      return combined

    def written(arrays, index, outputs):
      return {k: a.write(index, outputs[k]) for k, a in arrays.items()}

    @tf.function(reduce_retracing=True)
    def call(iterator, count):
      first = one(iterator.get_next())  # OutOfRange: the epoch is over.
      arrays = written({k: tf.TensorArray(v.dtype, size=0, dynamic_size=True, infer_shape=False)
                        for k, v in first.items()}, 0, first)
      ran = tf.constant(1)
      for _ in tf.range(count - 1):
        optional = iterator.get_next_as_optional()
        if not optional.has_value():
          break
        arrays, ran = written(arrays, ran, one(optional.get_value())), ran + 1
      # Every step's outputs: a scalar's stacked, a tensor's rows concatenated with each
      # step's count.
      scalars = {k: a.stack() for k, a in arrays.items() if first[k].shape.rank == 0}
      tensors = {k: (a.concat(), _row_counts(a)) for k, a in arrays.items()
                 if first[k].shape.rank != 0}
      return scalars, tensors, ran
    self._compiled[id(step_fn)] = call
    return call

  def _run_on_workers(self, step_fn, dataset, steps) -> Iterator[dict]:
    """Parameter-server training: calls scheduled on the workers, each reading its own endless
    copy of `dataset` (the coordinator rebuilds it on each worker from its graph)."""
    steps = steps or _length(dataset)
    if not steps:
      raise ConfigError("is needed under parameter_server for a dataset that does not know its "
                        "length", key="steps")
    if self._coordinator is None:
      from tfdist.training.parameter_server import coordinator_recording_progress
      self._coordinator = coordinator_recording_progress(self.strategy)
    if id(dataset) not in self._worker_iterators:
      data.require_serializable(dataset, "dataset")
      stream = dataset.repeat()
      if self._service:  # Passes every worker shares (`data_service.reading`).
        data.require_servable(dataset, "dataset")
        stream = reading.endless_passes(dataset, service=self._service)
      self._worker_iterators[id(dataset)] = iter(
          self._coordinator.create_per_worker_dataset(stream))
    iterator = self._worker_iterators[id(dataset)]
    per_call = self._steps_per_call
    counts = [min(per_call, steps - first) for first in range(0, steps, per_call)]
    calls = [(count, self._coordinator.schedule(self._on_a_worker(step_fn, count),
                                                args=(iterator,))) for count in counts]
    for i, (count, scheduled) in enumerate(calls):
      progress.begin_call(self._epoch, self._steps_into_epoch)
      outputs = scheduled.fetch()
      progress.finish_call(self._steps_into_epoch + count, _OWN_LOOP)
      if self._listening and self._notice.stop_now():  # The calls scheduled run first.
        with progress.collective(progress.Collective.COORDINATOR_JOIN):
          self._coordinator.join()
        self._advance(sum(counts[i:]))
        self._preempted()
      self._advance(count)
      for step_outputs in outputs:  # Every step's, as the synchronous loop yields them.
        yield StepLogs(_numpy(step_outputs))
    with progress.collective(progress.Collective.COORDINATOR_JOIN):
      self._coordinator.join()

  def _on_a_worker(self, step_fn, count: int):
    """The function a worker runs for one call of `count` steps (unrolled: a few steps, one
    scheduled function), returning every step's outputs."""
    key = ("workers", id(step_fn), count)
    if key not in self._compiled:
      strategy = self.strategy

      @tf.function
      def call(iterator):
        return [strategy.run(lambda b: _as_dict(step_fn(*_arguments(b, step_fn))),
                             args=(next(iterator),))
                for _ in range(count)]
      self._compiled[key] = call
    return self._compiled[key]

  def epochs(self, count: int | None = None) -> Iterator[int]:
    """The epochs to run, 0-based, starting where the config's checkpoint left off; each one's
    end is checkpointed (model, optimizer, step), the chief's files kept.

    While the epochs run, a termination notice (SIGTERM, or `checkpoint.preemption_signal`,
    with a `checkpoint.dir`) makes every worker save after the same call and exit with 42;
    the relaunched loop resumes at that step. When they end, models built in a half precision
    that `training.mixed_precision: auto` chose compute in the policy they were built with
    again (as does a `model.save` during the epochs).

    Args:
      count: the run's epochs; default the config's `training.epochs` (a count given wins, as
        `tfdist.fit`'s `epochs=` does).

    Yields:
      Each epoch's index.
    """
    count = settings.epochs(self.config, count)
    self.restore()
    self._announce()
    with contextlib.ExitStack() as stack:
      if self._notice is not None:
        stack.enter_context(self._notice.listening())
        self._listening = True
        stack.callback(setattr, self, "_listening", False)
      for model in self._models():
        stack.enter_context(dtype_policy.saved_as_built(model, self.precision.policy,
                                                        self._built_with))
      self._within_epochs = True
      stack.callback(setattr, self, "_within_epochs", False)
      stack.callback(self._close_files)
      for epoch in range(self._epoch, count):
        self._epoch = epoch
        progress.own_code(_OWN_LOOP, epoch)
        yield epoch
        progress.epoch_end()  # Its checkpoint.
        self._epoch, self._steps_into_epoch = epoch + 1, 0
        if epoch + 1 == count and self._averaging is not None:
          self._averaging.end()  # The model saved is the replicas' average.
        self.save()
    progress.done()
    for model in self._models():
      dtype_policy.give_back(model, self.precision.policy, self._built_with)
    if self._lease is not None:
      self._lease.release()
      self._lease = None

  def save(self) -> str | None:
    """Checkpoints the prepared models and optimizers, the step, the epoch and the steps into it
    under `checkpoint.dir/loop` (every task saves; only the chief's files are kept). `epochs`
    calls it at each epoch's end.

    Returns:
      The checkpoint's path, or None without a `checkpoint.dir`.
    """
    path = self._save()
    if not self._within_epochs:
      self._close_files()
    return path

  def _save(self, background: bool = False) -> str | None:
    """The checkpoint of this step; `background`: its variables copied now and written by
    TensorFlow's asynchronous checkpoint while the steps go on. A save first waits for the one
    being written, so a checkpoint is never more than one interval old."""
    if not self.config.checkpoint.dir:
      return None
    manager = self._checkpoint_manager()
    began = self._cadence.begin()  # Its cost: what the steps wait (TensorFlow writes after).
    self._checkpoint().sync()
    self._position.assign([self.step, self._epoch, self._steps_into_epoch])
    options = tf.train.CheckpointOptions(experimental_enable_async_checkpoint=background)
    with keras_fixes.repeatable_async_copies():  # The copy is made inside `save`.
      path = manager.save(checkpoint_number=self.step, options=options)
    self._cadence.waited(began)
    self._cadence.wrote(0.0)
    return path

  def restore(self) -> bool:
    """Restores the newest checkpoint of `checkpoint.dir/loop`, if any. A fresh start
    (`tfdist launch --fresh`, `TFDIST_FRESH=1`) removes them instead. `epochs` calls it first.

    Returns:
      Whether a checkpoint was restored.
    """
    directory = self._directory()
    if directory and os.environ.get(FRESH_ENV) == "1":
      if self.is_chief:
        shutil.rmtree(directory, ignore_errors=True)
      return False
    latest = directory and tf.train.latest_checkpoint(directory)
    if not latest:
      return False
    self._checkpoint().restore(latest).expect_partial()
    self.step, self._epoch, self._resume_skip = (int(v) for v in self._position.numpy())
    self.print(f"tfdist: resuming at epoch {self._epoch + 1}, step {self.step} from {latest}")
    return True

  def print(self, *args, **kwargs) -> None:
    """`print` on the chief alone (every worker runs the same loop)."""
    if self.is_chief:
      print(*args, **kwargs, flush=True)

  def _advance(self, steps: int) -> None:
    self.step += steps
    self._steps_into_epoch += steps

  def _after_call(self, steps: int, epoch_ends: bool = False) -> None:
    """After each call of the compiled steps: the step counted, the replicas averaged when
    due (`training.average_every`), a termination notice acted on (every worker asks), and a
    step backup saved when due (not at an epoch's end: the epoch's checkpoint is that step's)."""
    self._advance(steps)
    if self._averaging is not None:
      if not self._averaging.begun:
        self._averaging.begin([w for m in self._models() for w in m.weights],
                              self.step - steps)
      self._averaging.after_call(self.step)
    if self._listening and self._notice.stop_now():
      self._preempted()
    if epoch_ends or not self.config.checkpoint.dir:
      return
    if self._cadence.due(self._steps_into_epoch - steps, self._steps_into_epoch):
      # Every task at the same step: the copy reads replicated metrics (an all-reduce each).
      with progress.collective(progress.Collective.BACKUP_AGREEMENT):
        self._save(background=True)
    elif self.is_chief:
      where = f"epoch {self._epoch + 1}, step {self._steps_into_epoch}"
      report.say(self._cadence.skip_line(where))

  def _preempted(self) -> None:
    """Saves at this step (every worker at the same one) and exits with 42."""
    if self._averaging is not None:
      self._averaging.end()
    self.save()
    self._notice.exit_preempted(f"epoch {self._epoch + 1}, step {self._steps_into_epoch}",
                              self.print)

  def _models(self) -> list:
    return [o for o in self._tracked.values() if isinstance(o, keras.Model)]

  def _directory(self) -> str | None:
    return self.config.checkpoint.dir and os.path.join(self.config.checkpoint.dir, "loop")

  def _checkpoint(self) -> tf.train.Checkpoint:
    if not hasattr(self, "_position"):
      with tf.init_scope():
        self._position = tf.Variable([0, 0, 0], dtype=tf.int64, trainable=False)
      self._state = tf.train.Checkpoint(position=self._position, **self._tracked)
    return self._state

  def _checkpoint_manager(self) -> tf.train.CheckpointManager:
    """This task's checkpoint manager, made once: the chief's directory, or (on other tasks,
    which must save too) a scratch directory, removed when the epochs end."""
    if self._manager is None:
      directory, keep = self._directory(), self.config.checkpoint.max_to_keep
      if not self.is_chief:
        directory, keep = self._files.enter_context(checkpoints.scratch_dir(self.config)), 1
      self._manager = tf.train.CheckpointManager(self._checkpoint(), directory,
                                                 max_to_keep=keep)
    return self._manager

  def _close_files(self) -> None:
    """The last checkpoint written, a non-chief task's scratch directory removed."""
    if hasattr(self, "_state"):
      self._state.sync()
    self._manager = None
    self._files.close()


def _arguments(batch, step_fn=None) -> tuple:
  """The step's arguments: a batch's elements (`step(x, y)`), or the batch whole for a step of
  one parameter (`train_step(inputs)`, as TensorFlow's custom-training tutorial writes it)."""
  if not isinstance(batch, (tuple, list)) or _takes_one(step_fn):
    return (batch,)
  return tuple(batch)


def _takes_one(step_fn) -> bool:
  import inspect
  try:
    parameters = list(inspect.signature(step_fn).parameters.values())
  except (TypeError, ValueError):
    return False
  positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  return len(positional) == 1 and not any(p.kind == p.VAR_POSITIONAL for p in parameters)


def _as_dict(outputs) -> dict:
  if outputs is None:
    return {}
  return dict(outputs) if isinstance(outputs, dict) else {"output": outputs}


class _SyncedMetric:
  """A metric of a multi-worker loop whose `result()` reads no collective between runs.

  Keras's metric variables are sync-on-read: read outside a step, each is an all-reduce over
  the workers, so a metric read on the chief alone (`if tfdist.is_chief(): print(m.result())`)
  is a collective the other workers skip: the next step's all-reduce then meets the chief's
  read ("Shape mismatch in the collective instance"), or both wait for good. At the end of
  each `loop.run`, every worker reads each variable once (the all-reduce), and until the next
  run or `reset_state` a read gives that value on any worker alone.
  """

  def __init__(self, metric):
    self._variables = [getattr(v, "value", v) for v in metric.variables]
    keras_reset = metric.reset_state

    def reset_state():
      self.thaw()
      keras_reset()
    metric.reset_state = reset_state

  def freeze(self) -> None:
    for variable in self._variables:
      synced = type(variable)._get_cross_replica(variable)
      variable._get_cross_replica = lambda synced=synced: synced

  def thaw(self) -> None:
    for variable in self._variables:
      vars(variable).pop("_get_cross_replica", None)


class StepLogs(dict):
  """What `loop.run` yields for a step: its outputs by name; a missing name says which the step
  returned (a step returning one value returns it as "output")."""

  def __missing__(self, key):
    raise KeyError(f"{key!r}: the step returned {sorted(self) or 'nothing'}" + (
        f"; return {{{key!r}: value}} from the step to name its value {key!r}"
        if list(self) == ["output"] else ""))


_PACKED = "__tfdist_scalars"
_OWN_LOOP = "in its own loop (between calls)"


def _is_scalar(value) -> bool:
  value = tf.convert_to_tensor(value)
  return value.shape.rank == 0 and (value.dtype.is_floating or value.dtype.is_integer)


def _row_counts(array: tf.TensorArray) -> tf.Tensor:
  """The rows each step wrote into `array` (a TensorArray of tensors with a batch axis)."""
  return tf.map_fn(lambda i: tf.shape(array.read(i))[0], tf.range(array.size()),
                   fn_output_signature=tf.int32)


def _each_step(scalars: dict, tensors: dict, steps: int) -> Iterator[dict]:
  """One dict per step of a call: each scalar's value at that step, each tensor's rows of that
  step (`tensors[k]`: the rows of every step, and each step's count)."""
  offsets = {k: np.concatenate([[0], np.cumsum(counts)]) for k, (_, counts) in tensors.items()}
  for step in range(steps):
    yield StepLogs({**{k: v[step] for k, v in scalars.items()},
                    **{k: rows[offsets[k][step]:offsets[k][step + 1]]
                       for k, (rows, _) in tensors.items()}})


def _numpy(outputs) -> dict:
  return {k: tuple(np.asarray(p) for p in v) if isinstance(v, tuple) else
          np.asarray(v.numpy() if hasattr(v, "numpy") else v) for k, v in outputs.items()}


def _length(dataset) -> int | None:
  count = int(dataset.cardinality())
  return count if count > 0 else None
