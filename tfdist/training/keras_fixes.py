"""Workarounds for Keras 3 bugs under tf.distribute, around tfdist's own calls and, once
`install` ran in the process, around Keras's own `fit`, `evaluate` and `predict` of every model
built under a replicated strategy (the model `tfdist.fit` returns, or a script's own
`MirroredStrategy`/`MultiWorkerMirroredStrategy` under `tfdist launch`).

Each fix names its upstream issue, is guarded by the Keras version, and has a test
(tests/test_keras_fixes.py) that runs Keras unpatched and fails once upstream is fixed: then
delete the fix.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
import types
from typing import Any

import keras
import tensorflow as tf
from tensorflow.python.distribute import values as tf_values
from keras.src.backend.tensorflow import trainer as tf_trainer
from keras.src.optimizers import base_optimizer
from keras.src.trainers import trainer

import tfdist.progress as progress
from tfdist.strategy import gradient_reduction
from tfdist.training import accumulation


# Versions known to need the fixes; raise the bound once a test shows a newer one still does.
_BROKEN = (3, 0) <= tuple(int(p) for p in keras.version().split(".")[:2]) < (3, 16)


def in_multi_worker_mode(strategy) -> bool:
  return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and \
      strategy.extended._in_multi_worker_mode()


def _replicated(strategy) -> bool:
  return isinstance(strategy, (tf.distribute.MirroredStrategy,
                               tf.distribute.MultiWorkerMirroredStrategy,
                               tf.distribute.experimental.CentralStorageStrategy))


def _central_storage(strategy) -> bool:
  return isinstance(strategy, tf.distribute.experimental.CentralStorageStrategy) and \
      strategy.num_replicas_in_sync > 1


_inside = threading.local()  # Set while fixed_for holds: Keras's methods are already fixed.


def fixing() -> bool:
  """Whether Keras's methods run inside one of tfdist's own calls in this thread (`tfdist.fit`,
  `evaluate`, `predict`: they are fixed there, and their callbacks prepared)."""
  return getattr(_inside, "fixing", False)


def install() -> None:
  """Runs Keras's own `Model.fit`, `evaluate` and `predict`, for every model built under a
  replicated strategy (mirrored, multi_worker_mirrored, central_storage), inside `fixed_for`;
  other models are untouched. Idempotent; the methods are wrapped once per process.

  ```python
  keras_fixes.install()
  with tf.distribute.MultiWorkerMirroredStrategy().scope():
    model = make_model()
  model.fit(dataset)       # keras#20585 fixed in Keras's own fit
  ```
  """
  if not _BROKEN or getattr(keras.Model, "_tfdist_fixed", False):
    return
  for name in ("fit", "evaluate", "predict", "train_on_batch", "test_on_batch",
               "predict_on_batch"):
    setattr(keras.Model, name, _with_fixes(getattr(keras.Model, name)))
  # On the class that defines it: Keras's `compile_from_config` (`load_model`) compiles only a
  # model whose class's `compile` is `Trainer.compile` (else it takes it for a user's own).
  trainer.Trainer.compile = _compiled_in_its_scope(trainer.Trainer.compile)
  base_optimizer.BaseOptimizer.apply = built_before_its_step(base_optimizer.BaseOptimizer.apply)
  keras.Model._tfdist_fixed = True


def built_before_its_step(apply):
  """keras-team/keras#19246: a Keras optimizer applied first inside a `tf.function` under a
  strategy of several replicas (the step of TensorFlow's "Custom training with
  tf.distribute.Strategy" tutorial, unchanged) creates its slots in the trace; TensorFlow
  initialises them in a cond where the replicas' initializers meet an unfed placeholder ("You
  must feed a value for placeholder tensor 'cond/else/_1/cond/Placeholder_1'"), in plain
  TensorFlow too. Built first, eagerly in the strategy's scope (as tf-keras built its slots
  under `init_scope`). tests/test_keras_fixes.py runs the step unfixed: delete this once it
  trains."""
  @functools.wraps(apply)
  def apply_built(optimizer, grads, trainable_variables=None):
    if not optimizer.built and trainable_variables is not None and tf.inside_function() and \
        tf.distribute.has_strategy():
      strategy = tf.distribute.get_strategy()
      if _replicated(strategy) and strategy.num_replicas_in_sync > 1:
        variables = list(trainable_variables)

        def build(_):  # Once, across the replicas, outside the trace.
          with tf.init_scope(), strategy.scope():
            optimizer.build(variables)
          optimizer.built = True
        context = tf.distribute.get_replica_context()
        build(strategy) if context is None else context.merge_call(build)
    return apply(optimizer, grads, trainable_variables)
  return apply_built


def _compiled_in_its_scope(compile_method):
  """keras-team/keras#17187: a model built under a replicated strategy and compiled again
  outside its scope (Keras's transfer-learning guide's second phase, on the model
  `tfdist.fit` returned, whose scope its user never saw) fails at its next fit with
  "Mixing different tf.distribute.Strategy objects", with an optimizer made there or named
  by a string alike; and a metric made there keeps plain variables: under
  multi_worker_mirrored each worker's evaluate reported its own share's accuracy. Compiled in
  the model's scope instead; an optimizer or metric made outside it is made again there from
  its config (the same object the caller holds)."""
  @functools.wraps(compile_method)
  def compile(model, *args, **kwargs):
    strategy = getattr(model, "_distribute_strategy", None)
    if getattr(_inside, "fixing", False) or strategy is None or not _replicated(strategy) or \
        tf.distribute.has_strategy():
      return compile_method(model, *args, **kwargs)
    given = inspect.signature(compile_method).bind_partial(model, *args, **kwargs).arguments
    with strategy.scope():
      if isinstance(given.get("optimizer"), keras.optimizers.Optimizer):
        _optimizer_made_in(given["optimizer"], strategy)
      for metric in tf.nest.flatten([given.get("metrics"), given.get("weighted_metrics")]):
        if isinstance(metric, keras.metrics.Metric):
          _metric_made_in(metric)
      return compile_method(model, *args, **kwargs)
  return compile


def _optimizer_made_in(optimizer, strategy) -> None:
  """`optimizer`, made outside `strategy`'s scope, made again in it from its config."""
  if getattr(optimizer, "_distribution_strategy", strategy) is strategy:
    return
  if optimizer.built or int(optimizer.iterations.numpy()):
    raise ValueError(f"the optimizer {optimizer.name} passed to compile was made and used "
                     "outside the model's strategy; pass a new one (or a string)")
  _made_again(optimizer)


def _metric_made_in(metric) -> None:
  """`metric`, its variables made outside the current strategy's scope, made again in it."""
  if all(isinstance(getattr(v, "value", v), tf_values.DistributedVariable)
         for v in metric.variables):
    return
  _made_again(metric)


def _made_again(made):
  """`made` (a Keras optimizer or metric) made again from its config in the current scope,
  keeping the object; refused in one line when its config does not make it."""
  try:
    again = type(made).from_config(made.get_config())
  except (TypeError, ValueError) as error:
    raise ValueError(f"{type(made).__name__} {made.name!r} was made outside the model's "
                     "strategy scope and cannot be made again from its config (" + str(error)
                     + "): make it inside `with model.distribute_strategy.scope():`") from None
  made.__dict__ = again.__dict__


@contextlib.contextmanager
def repeatable_async_copies():
  """TensorFlow's asynchronous checkpoint copies every variable to the CPU in a `tf.function`
  at each save; Keras's variable makes a new `tf.Variable` for its copy at every call, so the
  second asynchronous save of a Keras model fails ("tf.function only supports singleton
  tf.Variables created on the first call"). While inside, the copy made at the first save is
  assigned again, as TensorFlow's own DistributedVariable does. Keras's code since
  keras-team/keras#18749 (keras/src/backend/tensorflow/core.py, `_copy_trackable_to_cpu`); no
  upstream issue found. tests/test_keras_fixes.py runs two saves unfixed and fails once Keras
  reuses its copy: then delete this."""
  from keras.src.backend.tensorflow import core
  own = core.Variable._copy_trackable_to_cpu

  def reused(self, object_map):
    self.value._copy_trackable_to_cpu(object_map)
    if self in object_map:
      object_map[self].assign(object_map[self.value])
    else:
      object_map[self] = tf.Variable(object_map[self.value])

  core.Variable._copy_trackable_to_cpu = reused if _BROKEN else own
  try:
    yield
  finally:
    core.Variable._copy_trackable_to_cpu = own


def _with_fixes(method):
  @functools.wraps(method)
  def call(model, *args, **kwargs):
    strategy = getattr(model, "_distribute_strategy", None)
    if getattr(_inside, "fixing", False) or strategy is None or not _replicated(strategy):
      return method(model, *args, **kwargs)
    bound = inspect.signature(method).bind_partial(model, *args, **kwargs)
    given, fitting = bound.arguments, method.__name__ == "fit"
    if fitting:
      steps, test_steps = given.get("steps_per_epoch"), given.get("validation_steps")
    else:
      steps, test_steps = None, given.get("steps")
    watched = progress.watched()
    if fitting and watched:  # The launcher's hang watch sees Keras's own loop, as tfdist.fit's.
      from tfdist.training.progress_callback import progress_callbacks
      first, last = progress_callbacks(given.get("initial_epoch") or 0)
      bound.arguments["callbacks"] = [first, *(given.get("callbacks") or []), last]
      args, kwargs = bound.args[1:], bound.kwargs
    with fixed_for(model, strategy, steps, test_steps=test_steps, training=fitting), \
        own_test_step_losses(model, strategy) if method.__name__ == "evaluate" \
        else _one_batch_distributed(model, strategy, method.__name__), \
        progress.keras_call(method.__name__) if watched and not fitting \
        else contextlib.nullcontext():
      return method(model, *args, **kwargs)
  return call


_ON_BATCH = {"train_on_batch": "train_function", "test_on_batch": "test_function",
             "predict_on_batch": "predict_function"}


@contextlib.contextmanager
def _one_batch_distributed(model, strategy, method: str):
  """Around Keras's `train_on_batch`, `test_on_batch` or `predict_on_batch` under several
  replicas: the batch is split over them, as fit splits a global batch. Keras hands the whole
  batch to every replica: `predict_on_batch` returned each row once per replica, and a metric
  counting rows counted each once per replica; the logs returned are the metrics read across
  the replicas. No upstream issue found;
  tests/test_keras_contract.py's `keras_methods` case checks all three against one device."""
  if method not in _ON_BATCH or strategy.num_replicas_in_sync == 1:
    yield
    return
  attribute = _ON_BATCH[method]
  getattr(model, "make_" + attribute)()
  made = getattr(model, attribute)

  def fed(batches):
    element = tuple(next(iter(batches)))
    while element[-1] is None:  # Keras's (x, y, sample_weight) without the ones not given.
      element = element[:-1]
    element = keras.tree.lists_to_tuples(element)  # A list of inputs is a structure.
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    batch = tf.data.Dataset.from_tensors(element).with_options(options)
    pieces = iter(strategy.experimental_distribute_dataset(batch))
    if attribute == "predict_function":  # A list of batches; the others take an iterator.
      return made([next(pieces)])
    # The metrics read across the replicas, as fit's epoch reads them (the step's own logs are
    # the replicas' mean of each one's partial result: an AUC of halves).
    return _synced_metrics_or_logs(model, made(pieces))
  setattr(model, attribute, fed)
  try:
    yield
  finally:
    setattr(model, attribute, made)


def own_test_step_losses(model, strategy):
  """Around an evaluate: a model's own `test_step` sees each replica's own mean loss, as on one
  device. Keras's `compute_loss` divides it by the replica count for gradients' sake, and a
  step that updates the loss metric with it, as Keras's guide writes, reported 1/N of the
  loss; Keras's own step unscales it itself. (Not for the validation inside Keras's own fit of
  such a model: tfdist.fit keeps one device's arithmetic through the whole fit.)

  Args:
    model: the model about to be evaluated.
    strategy: its strategy.

  Returns:
    A context manager: `replica_math.unscaled_keras_losses()` for a model with its own
    `test_step` over several replicas, else one that does nothing.

  ```python
  with keras_fixes.own_test_step_losses(model, model.distribute_strategy):
    model.evaluate(dataset)
  ```
  """
  from tfdist.training import replica_math
  if not keras_train_step(model, "test_step") and strategy.num_replicas_in_sync > 1:
    return replica_math.unscaled_keras_losses()
  return contextlib.nullcontext()


@contextlib.contextmanager
def without_fixes():
  """Keras's own methods unfixed while inside (tests showing an upstream bug still there)."""
  before = getattr(_inside, "fixing", False)
  _inside.fixing = True
  try:
    yield
  finally:
    _inside.fixing = before


def _mirrors(strategy) -> bool:
  return isinstance(strategy, (tf.distribute.MirroredStrategy,
                               tf.distribute.MultiWorkerMirroredStrategy))


@contextlib.contextmanager
def fixed_for(model, strategy, steps_per_epoch: int | None = None, clock=None,
              epoch_steps: int | None = None, test_steps: int | None = None,
              training: bool = False):
  """Applies the fixes `strategy` needs around one fit/evaluate/predict of `model`;
  `steps_per_epoch` is the fit's, when it passes one to Keras; `clock` (a
  `monitoring.step_times.StepClock`) times each training step of stamped batches;
  `epoch_steps` is the steps an epoch has, when known (local accumulation needs it: a call
  must never ask for a batch past the end of the data); `test_steps` is an evaluation's
  (`steps`, `validation_steps`): a call never runs past it; `training`: a fit."""
  optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)  # Under loss scaling.
  accumulating = accumulate_outside_cond(optimizer, strategy)
  fix_optimizer_arguments(optimizer, strategy)
  local = accumulating and epoch_steps and local_accumulation(model, strategy)
  if local:  # All-reduce once per update; tfdist's step loop lays the steps out.
    accumulation.install(optimizer, strategy, _accumulate_with_syncs_outside_cond)
    steps_per_epoch = steps_per_epoch or epoch_steps
  ends_when_data_does = training and not (steps_per_epoch or epoch_steps)
  if clock is not None or local or (_BROKEN and ends_when_data_does) or (
      model.steps_per_execution > 1 and (
          test_steps or (_BROKEN and (_mirrors(strategy) or steps_per_epoch)))):
    # keras-team/keras#19246: Keras loops over a nested tf.function holding the all-reduce; a
    # tf.function with collectives called in a tf.while_loop leaves an unfed placeholder.
    # And with steps_per_epoch, Keras's last call of an epoch runs steps_per_execution steps
    # whatever is left of the epoch: it eats the next epoch's batches. And since
    # keras-team/keras#21262 the optimizer counts an update in `apply` with no data dependency:
    # where an epoch ends when the data does (unknown length), Keras's own step counted one
    # more each epoch (one device too; `first_step`).
    limits = (steps_per_epoch, test_steps, clock)
    if getattr(model, "_tfdist_limits", limits) != limits:  # Functions made for others.
      model.train_function = model.test_function = None
    model._tfdist_limits = limits
    model._make_function = types.MethodType(
        lambda self, step: _make_function_looping_in_graph(self, step, steps_per_epoch, clock,
                                                           test_steps), model)
  elif "_make_function" in vars(model):  # Another call's loop (a fit's step clock): Keras's own.
    del model._make_function, model._tfdist_limits
    model.train_function = model.test_function = model.predict_function = None
  weigh_output_losses_by_rows(model)
  multi_worker = _BROKEN and in_multi_worker_mode(strategy)
  # keras-team/keras#20585: the symbolic build reduces the (x, y) PerReplica batch with
  # strategy.reduce("MEAN"), which accepts no nesting across workers and adds strings
  # (TextVectorization inside the model: "Value for attr 'T' of string ... AddN") under any
  # replicated strategy: build from the first local replica's tensors (and from the batch
  # without its timestamp).
  local_replica = (_BROKEN and _replicated(strategy)) or clock is not None
  if local_replica or (_BROKEN and _central_storage(strategy)):
    model._maybe_symbolic_build = types.MethodType(
        lambda self, iterator=None, data_batch=None: _build(
            self, iterator, data_batch, stamped=clock is not None, local_replica=local_replica,
            summed_deltas=_BROKEN and _central_storage(strategy)), model)
  if _BROKEN:
    model._get_metrics_result_or_logs = types.MethodType(_synced_metrics_or_logs, model)
  before, _inside.fixing = getattr(_inside, "fixing", False), True
  original = tf_trainer.reduce_per_replica
  if multi_worker:
    # keras-team/keras#20585: reduce_per_replica reduces rank-0 losses with axis=0. Use
    # axis=None.
    tf_trainer.reduce_per_replica = lambda values, strategy, reduction: _reduce_scalars_whole(
        original, values, strategy, reduction)
  try:
    yield
  finally:
    tf_trainer.reduce_per_replica = original
    _inside.fixing = before


def _synced_metrics_or_logs(model, logs):
  """The model's metrics, read across the replicas, when the step's logs name them.

  Keras reads its metrics at an epoch's end only when the last step's logs have the keys of
  `get_metrics_result()` (keras-team/keras#19529, for steps returning other values), compared
  before flattening: the `train_step` of Keras's "Customizing what happens in fit()" guide,
  returning `{m.name: m.result() for m in self.metrics}` (compiled metrics nested under
  "compile_metrics"), never matches, and its epoch reports the replicas' mean of each one's own
  partial result (a count of rows is 1/N of the truth across workers). No upstream issue
  found; tests/test_keras_fixes.py fails once Keras reads them itself. Read now, as the step's
  logs were: a metric whose `result()` is its variable would otherwise show, once the epoch's
  validation reset it, the validation's value (as Keras's own matching logs do)."""
  metric_logs = model.get_metrics_result()
  if isinstance(logs, dict):
    if set(logs) == set(metric_logs):
      return metric_logs
    flat = {}
    for key, value in logs.items():
      flat.update(value if isinstance(value, dict) else {key: value})
    if set(flat) == set(metric_logs):
      return {key: tf.convert_to_tensor(value) for key, value in metric_logs.items()}
  return logs


@contextlib.contextmanager
def epochs_of_their_own_length():
  """Each epoch of a fit inside reads its data to its end, however long the epoch before.

  tensorflow/tensorflow#41571: Keras learns an epoch's length from the first epoch of data of
  unknown length and stops every later one there (`EpochIterator._num_batches`), cutting a
  longer pass short; the tf.data service's passes differ by a step or two (their last pieces
  fall where the data workers' streams end). And keras-team/keras#23360 (in releases after
  3.15): its "ran out of data; interrupting training" warning, at each such end, is for a
  `steps_per_epoch` the data did not fill alone.
  """
  from keras.src.trainers import epoch_iterator
  iterator = epoch_iterator.EpochIterator
  enumerate_epoch, warn = iterator._enumerate_iterator, iterator._interrupted_warning

  def anew(self):
    self._num_batches = self.data_adapter.num_batches  # None: this pass ends with its data.
    return enumerate_epoch(self)

  def warn_for_steps(self):
    if self.steps_per_epoch:
      warn(self)
  iterator._enumerate_iterator, iterator._interrupted_warning = anew, warn_for_steps
  try:
    yield
  finally:
    iterator._enumerate_iterator, iterator._interrupted_warning = enumerate_epoch, warn


@contextlib.contextmanager
def each_epochs_own_progress_bar():
  """Keras's progress bar ends each epoch at the steps it ran.

  Keras's ProgbarLogger takes the first epoch's count of steps for the length of every later
  epoch of data of unknown length (`_finalize_progbar` keeps `target`), and finalizes each
  epoch at it: under the tf.data service, an epoch of 15 steps said "13/13" and its ms/step
  divided its time by 13 (keras/src/callbacks/progbar_logger.py; no upstream issue found).
  tfdist's served stream tells Keras a length its epochs seldom have (the pieces arrive apart:
  "32/32" for 19 steps: Keras numbers each call of `steps_per_execution` steps as full), and a
  dataset function's count is its pipeline's batches. Inside, each epoch's last line (and its
  ms/step) is at the optimizer's updates of the epoch; the bar before it keeps Keras's guess.
  tests/test_keras_fixes.py runs Keras's bar unfixed: delete this once it counts right.
  """
  from keras.src.callbacks import progbar_logger
  logger = progbar_logger.ProgbarLogger
  begin, end = logger.on_epoch_begin, logger.on_epoch_end

  def updates(model) -> int:
    return int(model.optimizer.iterations.numpy())  # This worker's copy: no collective.

  def own_count(self, epoch, logs=None):
    self.tfdist_began = updates(self.model)
    return begin(self, epoch, logs)

  def at_what_ran(self, epoch, logs=None):
    # Keras numbers a call's batches as full ones; the pass may end inside a call.
    self.seen = self.target = updates(self.model) - self.tfdist_began
    if self.progbar is not None:
      self.progbar.target = self.target
    return end(self, epoch, logs)
  logger.on_epoch_begin, logger.on_epoch_end = own_count, at_what_ran
  try:
    yield
  finally:
    logger.on_epoch_begin, logger.on_epoch_end = begin, end


def accumulate_outside_cond(optimizer, strategy) -> bool:
  """Makes `optimizer`'s gradient accumulation work under a replicated `strategy`; returns
  whether it accumulates there.

  keras-team/keras#20582: Keras's accumulation puts the optimizer's merge_call (a sync point)
  inside a cond, which tf.distribute refuses.
  """
  accumulating = _BROKEN and _replicated(strategy) and \
      getattr(optimizer, "gradient_accumulation_steps", None)
  if accumulating:
    optimizer._backend_apply_gradients = types.MethodType(_accumulate_with_syncs_outside_cond,
                                                          optimizer)
  return bool(accumulating)


def fix_optimizer_arguments(optimizer, strategy) -> None:
  """Gives `optimizer`'s Keras arguments one device's meaning under `strategy` (after its
  gradient accumulation and sharding are installed): `use_ema` refused on central_storage,
  the summed gradients clipped, the EMA overwrite outside a cond. Idempotent: `tfdist.fit`,
  `TrainingLoop` and each Keras call on the model apply it."""
  refuse_ema_on_central_storage(optimizer, strategy)
  clip_the_sum(optimizer, strategy)
  overwrite_ema_outside_cond(optimizer, strategy)


def clip_the_sum(optimizer, strategy) -> bool:
  """Makes `optimizer` clip the gradients summed over the replicas, as one device clips its
  gradient; returns whether it now does.

  tensorflow/tensorflow#33929: under a replicated strategy Keras clips each replica's gradient
  (of its share of the batch) before the all-reduce, so on 2 replicas `clipvalue=v` lets the
  summed gradient reach 2v and `clipnorm`/`global_clipnorm` bound each half apart (SGD with
  clipvalue: 0.096 from one device in 16 steps). Here the gradients are summed first, clipped,
  then updated without a second sum. Not under gradient accumulation (its update sums first
  already) nor sharded gradients (stages 2-3: a shard's clip needs the whole gradient's norm;
  Keras's per-replica clip is kept there); tests/test_sharded_optimizer.py's xfail pins the
  upstream behaviour.
  """
  if getattr(optimizer, "_tfdist_clips_the_sum", False) or not _replicated(strategy) or \
      strategy.num_replicas_in_sync < 2 or \
      getattr(getattr(optimizer, "tfdist_shards", None), "scatter", False) or \
      getattr(optimizer, "gradient_accumulation_steps", None) or not any(
          getattr(optimizer, key, None) for key in ("clipnorm", "clipvalue", "global_clipnorm")):
    return False
  keras_apply, keras_clip = optimizer._backend_apply_gradients, optimizer._clip_gradients
  summed = threading.local()  # Per replica: mirrored traces its replicas in threads at once.

  def clip(self, grads):  # Keras's clip, skipped for the sum clipped below.
    return grads if getattr(summed, "yes", False) else keras_clip(grads)
  gradient_reduction.wrap(optimizer, lambda reduce, pairs: pairs if getattr(summed, "yes", False)
                          else reduce(pairs))

  def apply(self, grads, trainable_variables):
    if tf.distribute.in_cross_replica_context():
      return keras_apply(grads, trainable_variables)
    pairs = list(zip(grads, [v.value for v in trainable_variables]))
    clipped = keras_clip([g for g, _ in self._all_reduce_sum_gradients(pairs)])
    summed.yes = True
    try:  # Keras's update of the clipped sum: its clip and its sum done above.
      return keras_apply(clipped, trainable_variables)
    finally:
      summed.yes = False
  optimizer._clip_gradients = types.MethodType(clip, optimizer)
  optimizer._backend_apply_gradients = types.MethodType(apply, optimizer)
  optimizer._tfdist_clips_the_sum = True
  return True


def refuse_ema_on_central_storage(optimizer, strategy) -> None:
  """Raises UnsupportedError for `use_ema` under central_storage: Keras updates the moving
  averages in each replica, which central storage's variables refuse (Keras's own
  CentralStorageStrategy fails alike: "You must specify an aggregation method")."""
  if getattr(optimizer, "use_ema", False) and _central_storage(strategy):
    from tfdist.errors import UnsupportedError
    raise UnsupportedError("use_ema: Keras updates an optimizer's moving averages in each "
                           "replica, which central_storage's variables refuse (Keras's own "
                           "CentralStorageStrategy fails alike): use mirrored. Received: "
                           "use_ema=True under central_storage")


def overwrite_ema_outside_cond(optimizer, strategy) -> bool:
  """Makes `optimizer`'s moving-average overwrite (`use_ema` with `ema_overwrite_frequency`)
  work under a replicated `strategy`; returns whether it now does.

  Keras overwrites the weights with their averages in a cond whose branch updates mirrored
  variables (a sync point), which tf.distribute refuses: Keras's own MirroredStrategy fails
  ("a synchronization point in the body"), as its gradient accumulation did (keras#20582).
  Here Keras's cond holds nothing and every step writes, outside it, the average where Keras
  would overwrite and the weight itself elsewhere. Not under gradient accumulation (tfdist's
  update for it keeps no average).
  """
  if getattr(optimizer, "_tfdist_overwrites_ema", False) or not _replicated(strategy) or \
      not (getattr(optimizer, "use_ema", False) and optimizer.ema_overwrite_frequency) or \
      getattr(optimizer, "gradient_accumulation_steps", None):
    return False
  keras_apply = optimizer._backend_apply_gradients
  keras_overwrite = optimizer._overwrite_model_variables_with_average_value
  applying = threading.local()  # Per replica thread, as mirrored traces them.

  def overwrite(self, trainable_variables):  # Keras's cond's branch, or its fit's end.
    return None if getattr(applying, "yes", False) else keras_overwrite(trainable_variables)

  def apply(self, grads, trainable_variables):
    applying.yes = True
    try:
      keras_apply(grads, trainable_variables)
    finally:
      applying.yes = False
    due = tf.equal((self.iterations + 1) % self.ema_overwrite_frequency, 0)
    for variable, average in zip(trainable_variables, self._model_variables_moving_average):
      self._distribution_strategy.extended.update(
          variable.value, lambda v, a: v.assign(tf.where(due, a, v)), args=(average,))
  optimizer._overwrite_model_variables_with_average_value = types.MethodType(overwrite,
                                                                             optimizer)
  optimizer._backend_apply_gradients = types.MethodType(apply, optimizer)
  optimizer._tfdist_overwrites_ema = True
  return True


def _build(self, iterator, data_batch, *, stamped: bool, local_replica: bool,
           summed_deltas: bool):
  if iterator is None or not (stamped or local_replica):
    type(self)._maybe_symbolic_build(self, iterator=iterator, data_batch=data_batch)
  elif self._distribute_strategy is not None:  # Else Keras builds when it traces.
    # From the first local replica's element spec (Keras's symbolic build reads only shapes
    # and dtypes), not a batch drawn from a new iterator: a Python generator's one stream
    # would lose the batch and what the iterator prefetched. (Keras's evaluate, dropping that
    # iterator under multi_worker_mirrored, segfaulted in 5 of 180 plain runs:
    # tests/test_keras_contract.py.)
    spec = tf.nest.map_structure(
        lambda s: s._value_specs[0] if isinstance(s, tf_values.PerReplicaSpec) else s,
        iterator._distributed_dataset.element_spec)
    data_batch = tf.nest.map_structure(lambda s: _Spec(tuple(s.shape), s.dtype),
                                       spec[0] if stamped else spec)
    with self.distribute_strategy.scope():
      if type(self).call is keras.Model.call and not keras_train_step(self):
        _optimizer_built(self)
      else:
        self._symbolic_build(data_batch=data_batch)
  if summed_deltas:
    sum_deltas(self.metrics_variables)  # keras#21054.


def _optimizer_built(model) -> None:
  """What Keras's symbolic build makes of a model without a `call`, whose own `train_step` uses
  its parts (keras-io's VAE: an encoder and a decoder): the optimizer, and nothing to call.
  Keras's build calls the model ("Model VAE does not have a `call()` method implemented":
  "Unable to automatically build the model") under any strategy; on one device it builds
  nothing before the step. No upstream issue found; tests/test_keras_fixes.py fails once
  Keras builds such a model."""
  if model.optimizer is not None and not model.optimizer.built:
    model.optimizer.build(model.trainable_variables)


class _Spec:
  """What Keras's symbolic build reads of a batch (a leaf of Keras's tree, unlike a tuple)."""

  def __init__(self, shape: tuple, dtype: Any):
    self.shape, self.dtype = shape, dtype


def counts_replicas_wrong(strategy) -> bool:
  """Whether Keras's metric updates miscount under `strategy` (keras#21054: CentralStorage)."""
  return _BROKEN and _central_storage(strategy)


def sum_deltas(variables) -> None:
  """Makes each variable's `assign_add` TensorFlow's own, which adds deltas, and its `assign` the
  delta it makes.

  keras-team/keras#21054: Keras's assign_add is assign(self + delta). Under CentralStorage a
  metric variable is an AggregatingVariable(SUM), which sums the replicas' assigned values (the
  old total counted once per replica); under parameter_server two workers updating at once
  lose one's increment. TensorFlow's assign_add sums the deltas, atomically on a ps.
  """
  if not _BROKEN:
    return
  for variable in variables:
    variable.assign_add = types.MethodType(_add_delta, variable)
    variable.assign = types.MethodType(_assign_as_delta, variable)


def _add_delta(variable, value):
  return variable.value.assign_add(tf.cast(value, variable.dtype))


def _assign_as_delta(variable, value):
  """`assign(new)` as the delta it adds to the variable: Keras's confusion-matrix metrics (AUC,
  Precision, ...) write `var.assign(var + delta)`, which an AggregatingVariable(SUM) sums with
  the old total in each replica's value, as for `assign_add`."""
  tensor = variable.value
  return tensor.assign_add(tf.cast(value, variable.dtype) - tensor)


def _reduce_scalars_whole(original, values, strategy, reduction):
  def reduce(value):
    if not isinstance(value, (tf.distribute.DistributedValues, tf.Tensor)):
      value = tf.convert_to_tensor(value)  # A Keras variable, or a Python number.
    if not isinstance(value, tf.distribute.DistributedValues) and not value.device:
      # A metric whose result() is its variable (a user's `return self.total`) comes back from
      # strategy.run as that variable, no tensor of a replica's device: tf.distribute refuses
      # to reduce it ("doesn't have device set"). Read it on this worker's device.
      with tf.device(strategy.extended.worker_devices[0]):
        value = tf.identity(value)
    if reduction in ("auto", "mean") and value.shape.rank == 0:
      return strategy.reduce("MEAN", value, axis=None)
    return original(value, strategy, reduction)
  return tf.nest.map_structure(reduce, values)


def local_accumulation(model, strategy) -> bool:
  """Whether `model` accumulates gradients locally (`training.accumulation`): under mirrored or
  multi_worker_mirrored, with Keras's own `train_step` (its logs are the metrics' results) and
  no loss scaling (whose update runs inside a cond)."""
  return _mirrors(strategy) and keras_train_step(model) and \
      not hasattr(model.optimizer, "inner_optimizer")


def keras_train_step(model, step: str = "train_step") -> bool:
  """Whether `model` runs Keras's own `step` ("train_step", or "test_step"), not a subclass's or
  an instance's."""
  return step not in vars(model) and \
      getattr(type(model), step) is getattr(tf_trainer.TensorFlowTrainer, step)


def _make_function_looping_in_graph(self, step_function, steps_per_epoch=None, clock=None,
                                    test_steps=None):
  """Keras's `_make_function` with the step inlined in one `tf.function` looping up to
  `steps_per_execution` steps while data remain, never past the end of an epoch of
  `steps_per_epoch` steps (for the training function) or an evaluation of `test_steps` (for
  the test function: Keras's own loop would run a call's `steps_per_execution` steps past
  `steps`, and tfdist chose that count, not the user). With a `clock`, each training step is
  timed from the moment it asks for its (stamped) batch.

  With Keras's own `train_step`, the logs are the metrics' results reduced once after the
  loop, not every step's (under MultiWorkerMirrored each reduction is a collective); with local
  gradient accumulation the steps run as "local" and "update" steps (`accumulation.layout`).
  """
  one_step = getattr(type(self), "_make_function")(self, step_function)  # Keras's own.
  strategy = self.distribute_strategy
  training = step_function == self.train_step
  timed = clock.timed(step_function) if training and clock is not None else None
  optimizer = getattr(self.optimizer, "inner_optimizer", self.optimizer)
  every = optimizer.gradient_accumulation_steps if training and \
      hasattr(optimizer, "tfdist_phase") else 0  # Set by accumulation.install.
  logs_once = training and keras_train_step(self)

  def run(data, requested_at, phase=None):
    if phase:
      optimizer.tfdist_phase = phase  # Read while the optimizer's update is traced.
    try:
      return (strategy.run(step_function, args=(data,)) if timed is None else
              strategy.run(timed, args=(data, requested_at)))
    finally:
      if phase:
        optimizer.tfdist_phase = None

  def reduced(outputs):
    return tf_trainer.reduce_per_replica(outputs, strategy, reduction="auto")

  def now():
    # Only a timed step reads the clock: op determinism refuses `Timestamp` (a stateful op that
    # runs even when unused), and the step loop must run under it.
    # A constant otherwise: AutoGraph cannot carry a None through a loop.
    return tf.timestamp() if timed is not None else tf.constant(0.0, tf.float64)

  def logs():
    return reduced(strategy.run(self.get_metrics_result))

  def step_on(iterator, phase):
    requested_at = now()
    run(iterator.get_next(), requested_at, phase)

  def rest_of_call(iterator, steps, outputs):
    """Steps 2..`steps` of a call while data remain; the last step's reduced outputs."""
    for _ in tf.range(steps - 1):
      requested_at = now()
      data = iterator.get_next_as_optional()
      if not data.has_value():
        break
      outputs = reduced(run(data.get_value(), requested_at))
    return outputs

  def rest_of_call_unreduced(iterator, steps):
    for _ in tf.range(steps - 1):
      requested_at = now()
      data = iterator.get_next_as_optional()
      if not data.has_value():
        break
      run(data.get_value(), requested_at)

  def first_step(iterator, outputs_of):
    """The call's first step, run only on a batch that is there; at the data's end an
    OutOfRange (an epoch's end, as Keras reads it) and no op of a step. A step's ops that
    take no batch (the optimizer's `iterations.assign_add`) ran while a failing `get_next`
    was still all-reducing "has data" under multi_worker_mirrored: each epoch of data of
    unknown length counted an update more (Adam's bias correction off: 4.9e-5 after 2
    epochs, found 2026-11-29)."""
    requested_at = now()
    data = iterator.get_next_as_optional()
    made = {}

    def present():
      made["outputs"] = outputs_of(run(data.get_value(), requested_at))
      return made["outputs"]

    def absent():
      ended = strategy.experimental_local_results(iterator.get_next())  # Raises OutOfRange.
      with tf.control_dependencies(tf.nest.flatten(ended, expand_composites=True)):
        return tf.nest.map_structure(
            lambda t: tf.zeros([d or 0 for d in t.shape], t.dtype), made["outputs"])
    return tf.cond(data.has_value(), present, absent)

  @tf.function(reduce_retracing=True)
  def steps_on_iterator(iterator, steps):
    if logs_once:
      first_step(iterator, lambda outputs: tf.constant(0))
      rest_of_call_unreduced(iterator, steps)
      return logs()
    return rest_of_call(iterator, steps, first_step(iterator, reduced))

  @tf.function(reduce_retracing=True)
  def steps_accumulating(iterator, steps):
    # Keras counts batches in `_iterations` (`iterations` counts updates when accumulating).
    lead, groups, trail = accumulation.layout(optimizer._iterations, steps, every)
    for _ in tf.range(lead):
      step_on(iterator, "local")
    for group in tf.range(groups):
      step_on(iterator, "update")
      for _ in tf.range(tf.where(group < groups - 1, every - 1, trail)):
        step_on(iterator, "local")
    return logs()

  done_in_epoch = [0]  # Keras calls the function ceil(steps_per_epoch / steps) times an epoch.

  def function(iterator):
    if not isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
      return one_step(iterator)
    steps = self.steps_per_execution
    limit = steps_per_epoch if training else test_steps
    if limit:
      steps = min(steps, limit - done_in_epoch[0])
      done_in_epoch[0] = (done_in_epoch[0] + steps) % limit
    loop = steps_accumulating if every > 1 else steps_on_iterator
    return loop(iterator, tf.constant(steps))
  return function


def _accumulate_with_syncs_outside_cond(self, grads, trainable_variables):
  """Gradient accumulation with the sync points (all-reduce, merge_call) run on every step and
  only the choice between "update" and "accumulate" inside the cond, in cross-replica context.

  The accumulators hold the all-reduced sum, the same on every replica (and on CentralStorage's
  single copy); on every `steps`-th step the variables are updated with (accumulated + current)
  / steps, clipped as Keras clips, and the accumulators are zeroed: Keras's arithmetic.
  """
  steps = self.gradient_accumulation_steps
  accumulators = [self._accumulated_gradients[self._get_variable_index(v)].value
                  for v in trainable_variables]
  variables = [v.value for v in trainable_variables]
  context = tf.distribute.get_replica_context()
  # Keras's all-reduce, or tfdist's compressed or timed one.
  reduced = [g for g, _ in self._all_reduce_sum_gradients(list(zip(grads, variables)))]
  averaged = self._clip_gradients([(g + a) / steps for g, a in zip(reduced, accumulators)])
  learning_rate = self.learning_rate
  is_update_step = (self._iterations + 1) % steps == 0

  def update_or_accumulate(distribution, reduced, averaged):
    def update():
      self._apply_weight_decay(variables)
      self._distributed_tf_update_step(distribution, list(zip(averaged, variables)),
                                       learning_rate)
      for a in accumulators:
        distribution.extended.update(a, lambda v: v.assign(tf.zeros_like(v)), group=False)
      return tf.constant(True)

    def accumulate():
      for g, a in zip(reduced, accumulators):
        distribution.extended.update(a, lambda v, g: v.assign_add(g), args=(g,), group=False)
      return tf.constant(False)
    tf.cond(is_update_step, update, accumulate)

  context.merge_call(update_or_accumulate, args=(reduced, averaged))


def count_every_update(model) -> None:
  """Makes the optimizer's step counter and the metrics' sums count every update of
  asynchronous workers (parameter-server training).

  keras-team/keras#21054 (the root): Keras's assign_add is assign(self + delta), a read then a
  write; two workers updating at once lose one's increment, so `optimizer.iterations` (and with
  it learning-rate schedules and Adam's bias correction) and the metrics undercount.
  TensorFlow's own assign_add is one atomic op on the ps.
  """
  sum_deltas([model.optimizer.iterations, *model.metrics_variables])


def weigh_output_losses_by_rows(model) -> None:
  """Makes each output's loss metric of a multi-output `model` (`val_cls_loss`) a mean over
  examples, as the total loss is.

  Keras 3's CompileLoss.call weighs an output's loss by its static batch size,
  `tree.flatten(y_p)[0].shape[0]` (keras/src/trainers/compile_utils.py; no upstream issue found),
  which is None in a function traced for a partial batch or a replica's share of one: such a
  batch then counts once, not by its examples, and the per-output losses of a partial last
  batch differ from one device's and between strategies (~1% measured). The rows counted at
  run time (`tf.shape`) replace it, as the total loss's tracker already does.
  """
  compile_loss = getattr(model, "_compile_loss", None)
  if not _BROKEN or compile_loss is None or getattr(compile_loss, "_tfdist_rows", False):
    return
  compile_loss._tfdist_rows = True
  if compile_loss.built:
    _count_rows(compile_loss)
    return
  keras_build = compile_loss.build

  def build(y_true, y_pred):
    keras_build(y_true, y_pred)
    _count_rows(compile_loss)
  compile_loss.build = build


def _count_rows(compile_loss) -> None:
  if not compile_loss.metrics:
    return
  from keras.src import tree
  flat = []
  for entry, metric in zip(compile_loss._flat_losses, compile_loss.metrics):
    rows, loss_fn = {}, entry.loss

    def counted(y_true, y_pred, sample_weight=None, loss_fn=loss_fn, rows=rows):
      rows["now"] = tf.shape(tree.flatten(y_pred)[0])[0]
      return loss_fn(y_true, y_pred, sample_weight)

    def update_state(values, sample_weight=None, keras_update=metric.update_state, rows=rows):
      return keras_update(values, sample_weight=rows.pop("now", sample_weight))
    metric.update_state = update_state
    flat.append(entry._replace(loss=counted))
  compile_loss._flat_losses = flat
