"""`tfdist.fit`, `tfdist.evaluate`, `tfdist.predict`: Keras's own loop, under the config's
strategy, with the model built in the strategy's scope and the batches sharded right.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Callable, Mapping

from tfdist.config import rules
from tfdist.config.batch import batch_sizes
from tfdist.config.loader import FRESH_ENV
from tfdist.config.roles import is_chief
from tfdist.config.schema import Config
from tfdist.errors import ConfigError, ModelError
from tfdist.config.loader import ConfigLike, as_config
from tfdist.strategy.factory import make_strategy


def fit(model_fn: Callable[[], Any], train_data=None, y=None, *, config: ConfigLike = None,
        compile: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None, batch_size: int | None = None,
        epochs: int | None = None, steps_per_epoch: int | None = None, shuffle: bool = True,
        validation_data=None, callbacks=None, **fit_kwargs):
  """Builds the model in the config's strategy scope, compiles it and fits it.

  The same call serves every task of a cluster: under the sync strategies every task trains;
  under parameter_server the chief runs tfdist's coordinator loop (the workers and ps run
  `tfdist cluster-server`); an `evaluator` task evaluates each checkpoint the chief writes on
  `validation_data` and logs the results for TensorBoard instead of training.

  Args:
    model_fn: returns the Keras model; called inside the strategy's scope (Keras records the
      strategy when a model is built).
    train_data: numpy arrays, a `tf.data.Dataset` of global batches, or a function of a
      `tf.distribute.InputContext` returning that worker's dataset.
    y: targets, with numpy `train_data`.
    config: a `Config`, a YAML path or a mapping; None reads TFDIST_CONFIG/TF_CONFIG and means
      one device when neither is set.
    compile: keyword arguments of `Model.compile` (optimizer, loss, metrics, ...), or a function
      returning them, called in the scope. Under multi_worker_mirrored pass a function (or
      strings): a Keras optimizer object made before the strategy starts TensorFlow too early.
      Omit it when `model_fn` compiles the model itself.
    batch_size: the global batch size; defaults to the config's.
    epochs: defaults to the config's `training.epochs`.
    steps_per_epoch: defaults to the config's `training.steps_per_epoch`.
    shuffle: shuffle numpy input each epoch, in the same order on every worker (tfdist
      shuffles before batching; Keras itself is told not to).
    validation_data: `(x, y)` arrays or a dataset, as for `Model.fit`.
    callbacks: Keras callbacks.
    **fit_kwargs: any other keyword argument of `Model.fit`, with its Keras meaning (under
      parameter_server: `verbose` only).

  Returns:
    The Keras `History`; the trained model is `history.model`.

  Raises:
    ConfigError: the config asks for something its strategy cannot do.
    ModelError: `model_fn`'s model is not compiled and `compile` is not given.

  Example:

  ```python
  import keras
  import numpy as np
  import tfdist
  x, y = np.random.rand(256, 4).astype("float32"), np.random.rand(256, 1).astype("float32")
  def make_model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
  history = tfdist.fit(make_model, x, y, config="configs/mirrored.yaml", epochs=2,
                       compile=dict(optimizer="adam", loss="mse"), verbose=0)
  model = history.model
  ```
  """
  config = as_config(config)
  _refuse_keras_distribution()
  evaluator = config.task is not None and config.task.type == "evaluator"
  strategy = make_strategy(config)  # An evaluator's is the default strategy.
  from tfdist.training import (checkpoints, data, keras_fixes, replica_math, report,
                               user_files)

  import keras
  training = config.training
  if training.seed is not None:
    keras.utils.set_random_seed(training.seed)
  hybrid = _hybrid(config)
  if hybrid:  # The strategy joined the cluster; each worker's split model is built outside it.
    import tensorflow as tf
    strategy = tf.distribute.get_strategy()
  replicas = hybrid.workers if hybrid else strategy.num_replicas_in_sync
  global_batch = batch_size or batch_sizes(training, replicas).global_batch_size
  epochs = epochs or training.epochs
  model, chosen, fused = _build(model_fn, compile, strategy, config, hybrid)
  if evaluator:
    from tfdist.training.evaluator import evaluate_checkpoints
    return evaluate_checkpoints(model, _validation(validation_data, strategy, global_batch),
                                config=config, epochs=epochs)
  files = checkpoints.callbacks(config, fresh=os.environ.get(FRESH_ENV) == "1")
  first_epoch, first_step = files[0].saved_position() if files else (0, 0)
  steps_per_epoch = steps_per_epoch or training.steps_per_epoch
  endless = steps_per_epoch is not None  # Epochs of the caller's length, not the data's.
  if shuffle and global_batch and data.is_arrays(train_data):
    steps_per_epoch = steps_per_epoch or data.batch_count(
        train_data, global_batch, strategy.num_replicas_in_sync)
  data.require_steps_for_generator(train_data, steps_per_epoch, "train_data")
  asynchronous = config.strategy.name == "parameter_server"
  from tfdist.monitoring import step_times, tensorboard
  optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)
  timed = not (asynchronous or hybrid) and bool(config.tensorboard.log_dir)
  clock = step_times.StepClock() if timed and not step_times.determinism_enabled() else None
  if timed and clock is None and is_chief(config):
    report.say(step_times.DETERMINISM_NOTICE)
  if clock:
    clock.time_all_reduce(optimizer)
  if files:
    from tfdist.training import preemption
    multi_worker = config.strategy.name == "multi_worker_mirrored" and bool(config.cluster.jobs)
    files.append(preemption.Preemption(
        files[0], strategy=strategy if multi_worker else None, first_step=first_step,
        signals=preemption.signals_of(config.checkpoint.preemption_signal), say=report.say))
  train = None if asynchronous else data.make_dataset(
      train_data, y, strategy=strategy, batch_size=global_batch, shuffle=shuffle,
      seed=training.seed, first_epoch=first_epoch, epochs=None if endless else epochs,
      name="train_data", then=(hybrid and hybrid.worker_slice) or (clock and clock.stamped))
  epoch_steps = _steps_in_an_epoch(train, steps_per_epoch)
  if epoch_steps and not asynchronous:
    # Epochs counted by steps over one endless stream: a finite dataset makes every
    # multi-worker get_next all-reduce "has data" (a collective a step), and re-iterating it
    # each epoch measured 1.75x slower even on one device (6.6k vs 11.7k examples/s).
    train, steps_per_epoch = data.endless(train), epoch_steps
  # Never more steps per call than an epoch has: the progress bar would count past the end.
  model.steps_per_execution = min(training.steps_per_execution, epoch_steps or sys.maxsize)
  if training.scale_learning_rate or training.warmup_epochs:
    from tfdist.training import schedule
    multiplier = replicas if training.scale_learning_rate else 1
    warmup = training.warmup_epochs * _require_steps(epoch_steps, config)
    schedule.scale_learning_rate(optimizer, multiplier, warmup)
  if is_chief(config):
    report.say(report.choices_line(
        strategy_name=config.strategy.name, replicas=replicas,
        global_batch=global_batch, precision=chosen, steps_per_execution=model.steps_per_execution,
        fused=fused, accumulation=training.gradient_accumulation_steps))
    if first_epoch or first_step:
      report.say(report.resume_line(first_epoch, epochs, files[0].directory,
                                    first_step if epoch_steps and not asynchronous else 0))
    if epoch_steps:  # Keras counts every batch as an optimizer step, accumulating or not.
      report.say(report.schedule_warning(optimizer._learning_rate, epochs=epochs,
                                         updates=epoch_steps * epochs,
                                         updates_per_epoch=epoch_steps))
  every = getattr(config.strategy.options, "average_every", 0)
  if every:
    from tfdist.training import local_sgd
    callbacks = [local_sgd.Averaging(strategy, every), *(callbacks or [])]
  callbacks = list(callbacks or []) + tensorboard.callbacks(
      config, strategy, first_epoch=first_epoch, epoch_steps=epoch_steps,
      global_batch=global_batch, clock=clock)
  with user_files.chief_only(callbacks, config, resuming=first_epoch > 0) as callbacks:
    if asynchronous:
      from tfdist.training import parameter_server
      history = parameter_server.fit(
          model, strategy, train_data, y, batch_size=global_batch, epochs=epochs,
          initial_epoch=first_epoch, steps_per_epoch=steps_per_epoch,
          steps_per_execution=model.steps_per_execution,
          validation=_validation(validation_data, None, global_batch),
          callbacks=files + callbacks, source=config.source,
          report=tensorboard.scalars_sink(callbacks), **_ps_kwargs(fit_kwargs, config))
      parameter_server.explain_keras_calls(model)
    else:
      validation = _validation(validation_data, strategy, global_batch)
      own_step = not hybrid and replicas > 1 and not keras_fixes.keras_train_step(model)
      if own_step:
        _one_device_arithmetic(model, optimizer, global_batch or data.batched_by(train_data),
                               config)
      parts = _parts(train, epochs, steps_per_epoch, first_epoch, first_step, epoch_steps)
      per_call, history = model.steps_per_execution, None
      for stream, start, end, steps in parts:
        if len(parts) > 1:  # Each its own steps per epoch: a train function of its own.
          model.steps_per_execution, model.train_function = min(per_call, steps), None
          files[0].delete_checkpoint = end == epochs  # The backup is kept between the two.
        with keras_fixes.fixed_for(model, strategy, steps, clock, epoch_steps), \
            data.empty_batches_explained("train_data"), \
            replica_math.unscaled_keras_losses() if own_step else contextlib.nullcontext():
          part = model.fit(stream, epochs=end, initial_epoch=start, steps_per_epoch=steps,
                           validation_data=validation, callbacks=files + callbacks,
                           shuffle=False, **fit_kwargs)
        history = _joined(history, part)
  if config.checkpoint.dir:
    checkpoints.save_final_model(model, config)
  user_files.save_on_chief_only(model, config)
  return history


def _parts(train, epochs: int, steps_per_epoch, first_epoch: int, first_step: int,
           epoch_steps: int | None) -> list[tuple]:
  """(stream, first epoch, end epoch, steps per epoch) of each Keras fit: one; or, resumed
  `first_step` steps into epoch `first_epoch` (a preemption), the rest of that epoch, then the
  epochs after it, each over the stream from where it stands (`train` starts at the epoch)."""
  if not (first_step and epoch_steps and first_step < epoch_steps):
    return [(train, first_epoch, epochs, steps_per_epoch)]
  rest = [(train.skip(epoch_steps), first_epoch + 1, epochs, epoch_steps)]
  return [(train.skip(first_step), first_epoch, first_epoch + 1, epoch_steps - first_step)] + (
      rest if first_epoch + 1 < epochs else [])


def _joined(history, part):
  """`part`'s History appended to `history`'s (None: `part` alone)."""
  if history is None:
    return part
  history.epoch += part.epoch
  for key, values in part.history.items():
    history.history.setdefault(key, []).extend(values)
  return history


def _one_device_arithmetic(model, optimizer, global_batch: int | None, config: Config) -> None:
  """A subclass's own `train_step` (written as for one device: a mean loss, `tape.gradient`,
  `apply_gradients`) trains as on one device: each replica's gradients weighted by its share of
  the global batch before they are summed (`replica_math`), not summed whole (measured: one
  device with twice the learning rate), and its losses not divided by the replicas (a reported
  loss halved) while `unscaled_keras_losses` is on."""
  from tfdist.training import replica_math
  if not global_batch:
    raise ConfigError("is needed to weigh each replica's share of a batch in the model's own "
                      "train_step: set it, or pass a dataset batched with a known size",
                      key="training.global_batch_size", source=config.source)
  replica_math.weight_gradients_by_share(optimizer)
  user_step = model.train_step
  model.train_step = lambda data: replica_math.with_share(data, global_batch,
                                                          lambda: user_step(data))[0]


def _build(model_fn, compile, strategy, config: Config, hybrid=None):
  """The model built and compiled in the strategy's scope, with tfdist's speed knobs, split
  over devices when the config says (`hybrid`: averaging gradients across workers); returns
  it, its `precision.Precision` and the name of the optimizer whose update is fused (or None)."""
  from tfdist.machine import precision
  from tfdist.training import dtype_policy, fused_updates, report

  training = config.training
  # Outside the scope: `auto`'s probe runs plain tensors on this process's device.
  chosen = precision.policy_for(training.mixed_precision,
                                loss_scaling=config.strategy.name not in rules.NO_LOSS_SCALING)
  with strategy.scope():
    with dtype_policy.building_with(chosen.policy):
      model = model_fn()
    dtype_policy.keep_outputs_float32(model)
    if compile is not None:
      model.compile(**(compile() if callable(compile) else compile))
    elif not model.compiled:
      raise ModelError("model_fn returned a model that is not compiled: compile it there or "
                       "pass compile=dict(optimizer=..., loss=...)")
    model.jit_compile = training.jit_compile
    optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)
    fused = training.fused_optimizer and fused_updates.install(optimizer)
    compressed = getattr(config.strategy.options, "gradient_compression", "none")
    if compressed != "none":
      from tfdist.training import compression
      compression.install(optimizer, compressed)
    if getattr(config.strategy.options, "average_every", 0):
      from tfdist.training import local_sgd
      local_sgd.install(optimizer, strategy)
    if training.gradient_accumulation_steps > 1:
      optimizer.gradient_accumulation_steps = training.gradient_accumulation_steps
    if config.parallel.enabled:
      from tfdist.parallel.split_model import describe, split
      split(model, config.parallel.stages, devices=config.parallel.devices or None,
            microbatches=config.parallel.microbatches, recompute=config.parallel.recompute,
            reduce_gradients=hybrid and hybrid.mean_gradients)
      if hybrid:
        hybrid.broadcast_weights(model)
      if is_chief(config):
        report.say(describe(model.tfdist_placement, config.parallel.microbatches))
  return model, chosen, type(optimizer).__name__ if fused else None


def global_batch_size(config: ConfigLike = None) -> int:
  """The global batch size `tfdist.fit` trains with under `config`: for a script that batches
  its own `tf.data.Dataset` (tfdist refuses a dataset batched by another size).

  Args:
    config: a `Config`, a YAML path or a mapping; None reads TFDIST_CONFIG/TF_CONFIG (what
      `tfdist launch` gives each task).

  Returns:
    `training.global_batch_size`, or `training.per_replica_batch_size` times the replicas in
    sync (makes the strategy to count them).

  Raises:
    ConfigError: the config gives neither.

  Example:

  ```python
  import numpy as np
  import tensorflow as tf
  import tfdist
  x, y = np.random.rand(256, 4), np.random.rand(256, 1)
  batch = tfdist.global_batch_size("configs/mirrored.yaml")
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)
  ```
  """
  config = as_config(config)
  if config.training.global_batch_size is None and config.training.per_replica_batch_size is None:
    raise ConfigError("is not set, so the global batch size is unknown: set it (or "
                      "training.per_replica_batch_size)", key="training.global_batch_size",
                      source=config.source)
  hybrid = _hybrid(config)
  replicas = hybrid.workers if hybrid else make_strategy(config).num_replicas_in_sync
  return batch_sizes(config.training, replicas).global_batch_size


def evaluate(model, x=None, y=None, *, config: ConfigLike = None, batch_size: int | None = None,
             **evaluate_kwargs):
  """`Model.evaluate` of a model built by `tfdist.fit`, under its strategy.

  Args:
    model: the model (`history.model`).
    x: as for `tfdist.fit`'s `train_data`.
    y: as for `tfdist.fit`'s `y`.
    config: gives the batch size when `batch_size` is not passed.
    batch_size: the global batch size for numpy input.
    **evaluate_kwargs: keyword arguments of `Model.evaluate`.

  Returns:
    What `Model.evaluate` returns: the loss, or a list with the metrics (a dict with
    `return_dict=True`).

  Example:

  ```python
  import keras
  import numpy as np
  import tfdist
  x, y = np.random.rand(256, 4).astype("float32"), np.random.rand(256, 1).astype("float32")
  def make_model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
  model = tfdist.fit(make_model, x, y, config="configs/mirrored.yaml", epochs=1, verbose=0,
                     compile=dict(optimizer="adam", loss="mse", metrics=["mae"])).model
  loss, mae = tfdist.evaluate(model, x, y, config="configs/mirrored.yaml", verbose=0)
  ```
  """
  from tfdist.training import data, keras_fixes

  strategy = model.distribute_strategy
  batch_size = _batch(config, strategy, batch_size)
  if _is_parameter_server(strategy):
    from tfdist.training import parameter_server
    return parameter_server.evaluate(model, data.make_dataset(x, y, strategy=None,
                                                              batch_size=batch_size),
                                     **evaluate_kwargs)
  dataset = data.make_dataset(x, y, strategy=strategy, batch_size=batch_size)
  with keras_fixes.fixed_for(model, strategy):
    return model.evaluate(dataset, **evaluate_kwargs)


def predict(model, x=None, *, config: ConfigLike = None, batch_size: int | None = None,
            out=None, stream: bool = False, **predict_kwargs):
  """Predictions of a model built by `tfdist.fit` (or any built model), under its strategy,
  in input order on every worker.

  numpy arrays and `tf.data.Dataset`s of batches take the fast path (`tfdist.serving.bulk`):
  one traced function for the batch size, each batch split over the replicas (and workers) and
  gathered back, written into one array -- a hand-written loop's speed, where Keras's
  `predict` gives ~0.6 of it and holds every output in memory. Other inputs, and Keras
  arguments (`callbacks`, `steps`, `verbose` 1 or 2 for a progress bar), go through Keras's
  `predict`.

  Args:
    model: the model (`history.model`).
    x: as for `tfdist.fit`'s `train_data`.
    config: gives the batch size when `batch_size` is not passed.
    batch_size: the global batch size.
    out: (fast path) an array or `np.memmap` to write into, or a `.npy` path written as the
      batches come.
    stream: (fast path) an iterator of output batches instead of the whole output.
    **predict_kwargs: keyword arguments of `Model.predict`.

  Raises:
    ConfigError: `out` or `stream` with an input or Keras argument the fast path cannot take.

  Returns:
    The predictions as a numpy array (`out` itself when given one; a memory-mapped array for a
    `.npy` path), or with `stream=True` an iterator of batches.

  Example:

  ```python
  import keras
  import numpy as np
  import tfdist
  with tfdist.make_strategy("configs/mirrored.yaml").scope():   # or tfdist.fit's model
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
  predictions = tfdist.predict(model, np.random.rand(256, 4).astype("float32"),
                               batch_size=64, out="predictions.npy")
  predictions.shape   # (256, 1)
  ```
  """
  import tensorflow as tf

  from tfdist.training import data, keras_fixes

  strategy = model.distribute_strategy
  batch_size = _batch(config, strategy, batch_size)
  if _is_parameter_server(strategy):
    from tfdist.training import parameter_server
    return parameter_server.predict(model, data.make_dataset(x, strategy=None,
                                                             batch_size=batch_size),
                                    **predict_kwargs)
  keras_arguments = {k: v for k, v in predict_kwargs.items()
                     if not (k == "verbose" and v in (0, "auto"))}
  if not keras_arguments and (data.is_arrays(x) or isinstance(x, tf.data.Dataset)):
    from tfdist.serving.bulk import bulk_predict
    if data.is_arrays(x):
      data.require_batch_size(batch_size, "x")
    return bulk_predict(model, x, batch_size=batch_size, out=out, stream=stream)
  if out is not None or stream:
    raise ConfigError("needs numpy arrays or a tf.data.Dataset, and no Keras predict "
                      f"arguments ({', '.join(keras_arguments) or 'none given'})",
                      key="out" if out is not None else "stream", received=type(x).__name__)
  dataset = data.make_dataset(x, strategy=strategy, batch_size=batch_size)
  with keras_fixes.fixed_for(model, strategy):
    return model.predict(dataset, **predict_kwargs)


def _hybrid(config: Config):
  """The cross-worker half of a split model trained by several workers, or None."""
  if not (config.parallel.enabled and config.strategy.name == "multi_worker_mirrored"):
    return None
  from tfdist.parallel.hybrid import Hybrid
  return Hybrid.for_config(config)


def _refuse_keras_distribution() -> None:
  import keras
  chosen = keras.distribution.distribution()
  if chosen is not None:
    raise ConfigError("is a no-op on the TensorFlow backend: Keras places every weight, full "
                      "size, on one device (keras-team/keras#18473); split the model with the "
                      "config's parallel: section or tfdist.parallel.split, and unset it with "
                      "keras.distribution.set_distribution(None)",
                      key="keras.distribution", received=type(chosen).__name__)


def _is_parameter_server(strategy) -> bool:
  import tensorflow as tf
  return isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)


def _batch(config: ConfigLike, strategy, batch_size: int | None) -> int | None:
  if batch_size:
    return batch_size
  return batch_sizes(as_config(config).training, strategy.num_replicas_in_sync).global_batch_size


def _steps_in_an_epoch(dataset, steps_per_epoch: int | None) -> int | None:
  """Steps in one epoch: the caller's, else the dataset's when it knows (None when not)."""
  if steps_per_epoch:
    return steps_per_epoch
  import tensorflow as tf
  count = int(dataset.cardinality()) if isinstance(dataset, tf.data.Dataset) else -1
  return count if count > 0 else None


def _require_steps(epoch_steps: int | None, config: Config) -> int:
  if epoch_steps is None:
    raise ConfigError("needs the number of steps in an epoch, which this dataset does not "
                      "know: set training.steps_per_epoch or pass steps_per_epoch",
                      key="training.warmup_epochs", received=config.training.warmup_epochs,
                      source=config.source)
  return epoch_steps


def _validation(validation_data, strategy, global_batch):
  from tfdist.training import data

  if isinstance(validation_data, tuple) and len(validation_data) == 2:
    return data.make_dataset(*validation_data, strategy=strategy, batch_size=global_batch,
                             name="validation_data")
  return data.make_dataset(validation_data, strategy=strategy, batch_size=global_batch,
                           name="validation_data")


def _ps_kwargs(fit_kwargs: Mapping[str, Any], config: Config) -> dict:
  """The `Model.fit` arguments tfdist's parameter-server loop takes (verbose)."""
  unsupported = sorted(set(fit_kwargs) - {"verbose"})
  if unsupported:
    raise ConfigError("is not supported under parameter_server (tfdist's coordinator loop "
                      "takes batch_size, epochs, steps_per_epoch, validation_data, callbacks "
                      "and verbose)", key=unsupported[0], received=fit_kwargs[unsupported[0]],
                      source=config.source)
  return dict(fit_kwargs)

