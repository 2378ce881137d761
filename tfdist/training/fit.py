"""`tfdist.fit`, `tfdist.evaluate`, `tfdist.predict`: Keras's own loop, under the config's
strategy, with the model built in the strategy's scope and the batches sharded right.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from typing import Any, Callable, Mapping

from tfdist.config import strategies
from tfdist.config.loader import FRESH_ENV
from tfdist.config.roles import is_chief
from tfdist.config.schema import Config
from tfdist.errors import ConfigError, ModelError
from tfdist.machine.precision import FLOAT32
from tfdist.config.loader import ConfigLike, as_config
from tfdist.data_service import reading
from tfdist.strategy.factory import make_strategy
from tfdist.training import settings


def fit(model_fn: Callable[[], Any], train_data=None, y=None, *, config: ConfigLike = None,
        compile: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
        batch_size: int | None = None, epochs: int | None = None,
        steps_per_epoch: int | None = None, shuffle: bool = True, validation_data=None,
        validation_split: float = 0.0, validation_batch_size: int | None = None,
        sample_weight=None, class_weight=None, initial_epoch: int = 0, callbacks=None,
        **fit_kwargs):
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
    batch_size: the global batch size; defaults to the config's, and for numpy arrays when
      the config gives none to Keras's own default, 32.
    epochs: defaults to the config's `training.epochs`.
    steps_per_epoch: defaults to the config's `training.steps_per_epoch`.
    shuffle: shuffle numpy input each epoch, in the same order on every worker (tfdist
      shuffles before batching; Keras itself is told not to).
    validation_data: `(x, y)` or `(x, y, sample_weight)` arrays, or a dataset, as for
      `Model.fit`.
    validation_split: the last fraction of array input held out for validation, as Keras
      holds it out (before shuffling; ignored when `validation_data` is given).
    validation_batch_size: the global batch of array validation data; default the training
      batch.
    sample_weight: weights of the examples of array input, as for `Model.fit`.
    class_weight: {class: weight}, each example's loss weighed by its class, as for
      `Model.fit` (whatever the input: Keras's own map of its batches).
    initial_epoch: the epoch to start at, as for `Model.fit` (a resumed backup's, when later).
    callbacks: Keras callbacks.
    **fit_kwargs: any other keyword argument of `Model.fit` (`verbose`, `validation_steps`,
      `validation_freq`), with its Keras meaning; what each argument does
      under each path is `tfdist.training.keras_arguments.FIT`.

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
  from tfdist.training import keras_arguments
  config = as_config(config)
  paths = settings.paths_of(config, settings.FIT)
  settings.refuse_keras_distribution(paths)
  settings.refuse_unhonoured(config, paths)
  given = {**fit_kwargs, "sample_weight": sample_weight, "class_weight": class_weight,
           "validation_batch_size": validation_batch_size}
  keras_arguments.refuse("fit", given, keras_arguments.PARAMETER_SERVER
                         if settings.PARAMETER_SERVER in paths else keras_arguments.SYNCHRONOUS)
  if config.cluster.dispatcher:
    _require_servable(train_data)
  train_data, y, sample_weight, validation_data = keras_arguments.split_validation(
      train_data, y, sample_weight, validation_split=validation_split,
      validation_data=validation_data)
  inputs = _Inputs(train_data, y, sample_weight, validation_data, validation_batch_size,
                   initial_epoch, class_weight)
  with settings.holding_checkpoint_dir(config):
    return _fit(model_fn, inputs, config, compile, batch_size, epochs, steps_per_epoch,
                shuffle, callbacks, fit_kwargs)


@dataclasses.dataclass(frozen=True)
class _Inputs:
  """The data arguments of one `tfdist.fit`, once `validation_split` is cut off."""
  train_data: Any
  y: Any
  sample_weight: Any
  validation_data: Any
  validation_batch_size: int | None
  initial_epoch: int
  class_weight: Any = None


def _fit(model_fn, inputs: _Inputs, config: Config, compile, batch_size, epochs,
         steps_per_epoch, shuffle, callbacks, fit_kwargs):
  """`fit`'s steps, in order."""
  from tfdist.training import data, dtype_policy, user_files
  train_data, y, validation_data = inputs.train_data, inputs.y, inputs.validation_data
  run = _start(model_fn, compile, config, batch_size, epochs, data.is_arrays(train_data))
  run.validation_batch = inputs.validation_batch_size or run.global_batch
  if run.evaluator:
    from tfdist.training.evaluator import evaluate_checkpoints
    return evaluate_checkpoints(
        run.model, data.validation_dataset(validation_data, run.strategy, run.validation_batch),
        config=config, epochs=run.epochs)
  _prepare_data(run, inputs, shuffle, steps_per_epoch)
  _announce(run)
  callbacks = _callbacks(run, callbacks)
  with user_files.chief_only(callbacks, config, resuming=run.resumed) as callbacks, \
      dtype_policy.saved_as_built(run.model, run.chosen.policy, run.built_with):
    if run.asynchronous:
      history = _fit_on_parameter_servers(run, train_data, y, validation_data, callbacks,
                                          fit_kwargs)
    else:
      history = _fit_synchronously(run, validation_data, callbacks, fit_kwargs)
  _finish(run)
  return history


@dataclasses.dataclass
class _Run:
  """What one `tfdist.fit` works with, filled in as it goes."""
  config: Config
  strategy: Any
  hybrid: Any
  model: Any = None
  chosen: Any = None  # The machine.precision.Precision the model trains in.
  built_with: str = "float32"  # The user's dtype policy, given back after training.
  installed: settings.Installed = settings.Installed(fused=None, accumulation=1, averaging=None)
  shuffle_seed: int | None = None  # training.seed, or the script's own: the arrays' shuffle.
  seed_note: str | None = None  # The start line's: the script's seed, not training.seed.
  global_batch: int | None = None
  epochs: int = 1
  validation_batch: int | None = None
  compiled_per_call: int = 1  # The model's own compile(steps_per_execution=), given back.
  files: list = dataclasses.field(default_factory=list)
  first_epoch: int = 0
  first_step: int = 0
  resumed: bool = False  # From a backup (not the caller's initial_epoch).
  read_anew: bool = False  # A reshuffling dataset, read by Keras epoch by epoch.
  served: bool = False  # Read through the tf.data service: a new pass each time it is read.
  shuffled_arrays: bool = False  # Arrays in tfdist's seeded order.
  shuffled_batches: bool = False  # A PyDataset's batches in tfdist's seeded order.
  train: Any = None
  steps_per_epoch: int | None = None
  epoch_steps: int | None = None
  clock: Any = None
  progress: Any = None  # (first, last) callbacks recording progress for the hang watch.

  @property
  def evaluator(self) -> bool:
    return self.config.task is not None and self.config.task.type == "evaluator"

  @property
  def asynchronous(self) -> bool:
    return strategies.kind(self.config.strategy.name).asynchronous

  @property
  def replicas(self) -> int:
    return self.hybrid.workers if self.hybrid else self.strategy.num_replicas_in_sync

  @property
  def optimizer(self):
    return getattr(self.model.optimizer, "inner_optimizer", self.model.optimizer)


def _start(model_fn, compile, config: Config, batch_size: int | None, epochs: int | None,
           arrays: bool = False) -> _Run:
  """The strategy made, the model built."""
  from tfdist.training import keras_fixes, user_files
  strategy = make_strategy(config)  # An evaluator's is the default strategy.
  keras_fixes.install()  # Keras's own methods on the model fixed too.
  user_files.checkpoints_on_chief_only(config)  # A script's own tf.train.Checkpoint.
  seeded = settings.seed(config)
  hybrid = _hybrid(config)
  if hybrid:  # The strategy joined the cluster; each worker's split model is built outside it.
    import tensorflow as tf
    strategy = tf.distribute.get_strategy()
  run = _Run(config, strategy, hybrid, epochs=settings.epochs(config, epochs))
  run.shuffle_seed, run.seed_note = seeded.value, seeded.note
  run.global_batch = settings.global_batch(config, run.replicas, batch_size, arrays)
  _build(run, model_fn, compile)
  return run


def _prepare_data(run: _Run, inputs: _Inputs, shuffle: bool,
                  steps_per_epoch: int | None) -> None:
  """The training stream, the steps in an epoch, and where training starts: the caller's
  `initial_epoch`, or a backup's position when it is later."""
  from tfdist.training import checkpoints, data, py_datasets, report
  from tfdist.monitoring import step_times
  config = run.config
  train_data, y = inputs.train_data, inputs.y
  run.files = checkpoints.callbacks(config, fresh=os.environ.get(FRESH_ENV) == "1")
  run.first_epoch, run.first_step = run.files[0].saved_position() if run.files else (0, 0)
  run.resumed = bool(run.first_epoch or run.first_step)
  if inputs.initial_epoch > run.first_epoch:
    run.first_epoch, run.first_step = inputs.initial_epoch, 0
  steps_per_epoch = settings.steps_per_epoch(config, steps_per_epoch)
  if steps_per_epoch and run.global_batch and data.is_arrays(train_data) and \
      not run.asynchronous:  # Keras's loop, not the parameter-server one's endless reads.
    _require_whole_epochs(steps_per_epoch, data.batch_count(
        train_data, run.global_batch, run.strategy.num_replicas_in_sync))
  py_dataset = py_datasets.is_py_dataset(train_data)
  if py_dataset and not run.asynchronous:
    _require_py_dataset_batch(run, train_data)
    if steps_per_epoch:
      _require_whole_epochs(steps_per_epoch, py_datasets.batch_count(train_data, "train_data"))
  endless = steps_per_epoch is not None  # Epochs of the caller's length, not the data's.
  run.shuffled_arrays = bool(shuffle and data.is_arrays(train_data))
  run.shuffled_batches = bool(shuffle and py_dataset)
  if shuffle and run.global_batch and data.is_arrays(train_data):
    steps_per_epoch = steps_per_epoch or data.batch_count(
        train_data, run.global_batch, run.strategy.num_replicas_in_sync)
  if py_dataset:  # One stream of its passes, read by steps.
    steps_per_epoch = steps_per_epoch or py_datasets.batch_count(train_data, "train_data")
  data.require_steps_for_generator(train_data, steps_per_epoch, "train_data")
  timed = not (run.asynchronous or run.hybrid) and bool(config.tensorboard.log_dir)
  run.clock = step_times.StepClock() if timed and not step_times.determinism_enabled() else None
  if timed and run.clock is None and is_chief(config):
    report.say(step_times.DETERMINISM_NOTICE)
  if run.clock:
    run.clock.time_all_reduce(run.optimizer)
  service = settings.data_service(config)
  if service and not run.asynchronous:  # The parameter-server loop reads its own way.
    run.train = _served(run, data.class_weighted(train_data, inputs.class_weight), service)
  else:
    run.train = None if run.asynchronous else data.make_dataset(
        train_data, y, strategy=run.strategy, batch_size=run.global_batch, shuffle=shuffle,
        seed=run.shuffle_seed, first_epoch=run.first_epoch,
        epochs=None if endless else run.epochs, name="train_data",
        sample_weight=inputs.sample_weight, class_weight=inputs.class_weight,
        then=(run.hybrid and run.hybrid.worker_slice) or (run.clock and run.clock.stamped))
  run.epoch_steps = _steps_in_an_epoch(run.train, steps_per_epoch)
  run.steps_per_epoch = steps_per_epoch
  run.read_anew = run.served or (not endless and data.reshuffles(run.train))
  if run.epoch_steps and not run.asynchronous and not run.read_anew and \
      not py_dataset:  # A PyDataset's stream holds the fit's passes alone.
    # Epochs counted by steps over one endless stream: a finite dataset makes every
    # multi-worker get_next all-reduce "has data" (a collective a step), and re-iterating it
    # each epoch measured 1.75x slower even on one device (6.6k vs 11.7k examples/s).
    # Not a dataset that reshuffles each time it is read: Keras reads it anew each epoch, and
    # makes one iterator more at each epoch's end (keras/src/trainers/epoch_iterator.py), so
    # epoch e trains on its (2e-1)-th order; one device's order needs Keras's own reads.
    run.train, run.steps_per_epoch = data.endless(run.train), run.epoch_steps
  # Never more steps per call than an epoch has: the progress bar would count past the end.
  run.model.steps_per_execution = min(settings.steps_per_execution(config, run.compiled_per_call),
                                      run.epoch_steps or sys.maxsize)
  settings.learning_rate_schedule(run.optimizer, config, run.replicas, run.epoch_steps)


def _served(run: _Run, train_data, service: str):
  """The training dataset read through the tf.data service: each epoch one pass shared by
  every trainer, or one per trainer (`data_service.passes`; `tfdist.data_service.reading`)."""
  from tfdist.progress import Collective
  from tfdist.training import agreement, data
  data.require_batched(train_data, "train_data")
  data.require_batched_by(train_data, run.global_batch, "train_data")
  token = agreement.agreed_token(run.strategy, Collective.DATA_SERVICE_NAME)
  stamped = run.clock.stamped if run.clock else (lambda dataset: dataset)
  run.served = True
  # The served stream's batches are the replicas' pieces: the global batch is the dataset's
  # (a model's own train_step weighs each replica's share by it).
  run.global_batch = run.global_batch or data.batched_by(train_data)
  return reading.served(train_data, strategy=run.strategy, service=service,
                        global_batch=run.global_batch, token=token,
                        then=lambda stream: data.counted(stamped(stream)),
                        passes=run.config.data_service.passes)


def _require_servable(train_data) -> None:
  """Raises DataError for training data the tf.data service cannot run: anything but a
  `tf.data.Dataset` (arrays have no pipeline to run, a generator's Python and a dataset
  function's per-worker pipelines cannot be sent)."""
  import tensorflow as tf
  from tfdist.training import data
  if not isinstance(train_data, tf.data.Dataset):
    raise data.DataError("train_data: the tf.data service (cluster.dispatcher) runs a "
                         "tf.data.Dataset's pipeline on its data workers: pass one, batched by "
                         "the global batch, or leave the dispatcher and data workers out. "
                         f"Received: {type(train_data).__name__}")
  data.require_servable(train_data, "train_data")


def _require_py_dataset_batch(run: _Run, py_dataset) -> None:
  """A PyDataset's batches are the global batches: its first batch's rows are the global batch,
  refused in one line when the config or batch_size says another."""
  from tfdist.training import data, py_datasets
  rows = py_datasets.batch_rows(py_dataset, "train_data")
  if run.global_batch and run.global_batch != rows:
    raise data.DataError(f"train_data: a PyDataset's batches are the global batches: "
                         f"the config's or batch_size's global batch, {run.global_batch}, "
                         "differs; leave the batch size out of the config. Received: a "
                         f"PyDataset of batches of {rows}")
  run.global_batch = rows


def _require_whole_epochs(steps_per_epoch: int, batches: int) -> None:
  """Raises ConfigError where Keras's meaning of `steps_per_epoch` over arrays differs from one
  stream of batches: Keras ends an epoch early where the arrays end, then starts them again."""
  if batches % steps_per_epoch and steps_per_epoch % batches:
    raise ConfigError(f"must divide the {batches} batches of the arrays, or be a multiple of "
                      "them: Keras ends an epoch early where the arrays end (epochs of "
                      f"{steps_per_epoch} and {batches % steps_per_epoch} steps), tfdist reads "
                      "them as one stream; or pass a repeated dataset",
                      key="steps_per_epoch", received=steps_per_epoch)


def _announce(run: _Run) -> None:
  """The chief's start line, resume line and schedule warning."""
  from tfdist.training import report, sharded_parameters
  config = run.config
  if not is_chief(config):
    return
  report.say(report.choices_line(
      strategy_name=config.strategy.name, replicas=run.replicas, global_batch=run.global_batch,
      precision=run.chosen, steps_per_execution=run.model.steps_per_execution,
      fused=run.installed.fused, accumulation=run.installed.accumulation,
      sharded=sharded_parameters.describe_sharding(
          run.optimizer, run.model.trainable_variables, [run.model]),
      shuffled_arrays=run.shuffled_arrays, shuffled_batches=run.shuffled_batches,
      seed_note=run.seed_note,
      data_workers=config.cluster.data_worker if run.served else 0,
      passes=config.data_service.passes))
  if run.resumed:
    report.say(report.resume_line(
        run.first_epoch, run.epochs, run.files[0].directory,
        run.first_step if run.epoch_steps and not run.asynchronous else 0))
  if run.epoch_steps:  # Keras counts every batch as an optimizer step, accumulating or not.
    report.say(report.schedule_warning(run.optimizer._learning_rate, epochs=run.epochs,
                                       updates=run.epoch_steps * run.epochs,
                                       updates_per_epoch=run.epoch_steps))


def _callbacks(run: _Run, callbacks) -> list:
  """The user's callbacks with tfdist's: the launcher's progress first, the preemption notice
  after the backup, periodic averaging before the user's, TensorBoard's last."""
  from tfdist.training.progress_callback import progress_callbacks
  from tfdist.training import report
  from tfdist.monitoring import tensorboard
  if run.files:  # Backups within epochs whose length is known (not the asynchronous loop's).
    run.files[0].within_epochs(None if run.asynchronous else run.epoch_steps, run.first_step,
                               settings.backup_cadence(run.config, run.strategy))
  notice = settings.preemption_notice(run.config, run.strategy)
  if notice is not None:
    from tfdist.training import preemption
    run.files.append(preemption.Preemption(run.files[0], notice, say=report.say))
  averaging = run.installed.averaging
  run.progress = progress_callbacks(run.first_epoch)
  return [*([averaging] if averaging else []), *(callbacks or [])] + tensorboard.callbacks(
      run.config, run.strategy, first_epoch=run.first_epoch, epoch_steps=run.epoch_steps,
      global_batch=run.global_batch, clock=run.clock)


def _bracketed(run: _Run, callbacks) -> list:
  """Every callback of the fit between the two recording its progress (`progress_callback`)."""
  first, last = run.progress
  return [first, *run.files, *callbacks, last]


def _fit_on_parameter_servers(run: _Run, train_data, y, validation_data, callbacks,
                              fit_kwargs):
  from tfdist.monitoring import tensorboard
  from tfdist.training import data, parameter_server
  history = parameter_server.fit(
      run.model, run.strategy, train_data, y, batch_size=run.global_batch, epochs=run.epochs,
      initial_epoch=run.first_epoch, steps_per_epoch=run.steps_per_epoch,
      steps_per_execution=run.model.steps_per_execution,
      validation=data.validation_dataset(validation_data, None, run.validation_batch),
      callbacks=_bracketed(run, callbacks), source=run.config.source,
      report=tensorboard.scalars_sink(callbacks), service=settings.data_service(run.config),
      **_ps_kwargs(fit_kwargs, run.config))
  parameter_server.explain_keras_calls(run.model)
  return history


def _fit_synchronously(run: _Run, validation_data, callbacks, fit_kwargs):
  """Keras's fit, once, or twice after a preemption mid-epoch (`_parts`)."""
  from tfdist.training import data, keras_fixes, replica_math
  model = run.model
  validation = data.validation_dataset(validation_data, run.strategy, run.validation_batch)
  own_step = not run.hybrid and run.replicas > 1 and not keras_fixes.keras_train_step(model)
  if own_step:
    _one_device_arithmetic(model, run.optimizer,
                           run.global_batch or data.batched_by(run.train), run.config)
  parts = _parts(run.train, run.epochs, run.steps_per_epoch, run.first_epoch, run.first_step,
                 run.epoch_steps, endless=not run.read_anew, skippable=not run.served)
  per_call, history = model.steps_per_execution, None
  for stream, start, end, steps in parts:
    if len(parts) > 1:  # Each its own steps per epoch: a train function of its own.
      model.steps_per_execution, model.train_function = min(per_call, steps), None
      run.files[0].delete_checkpoint = end == run.epochs  # The backup is kept between the two.
    with keras_fixes.fixed_for(model, run.strategy, steps, run.clock, run.epoch_steps,
                               test_steps=fit_kwargs.get("validation_steps"), training=True), \
        data.empty_batches_explained("train_data"), \
        replica_math.unscaled_keras_losses() if own_step else contextlib.nullcontext(), \
        keras_fixes.epochs_of_their_own_length() if run.served else contextlib.nullcontext(), \
        keras_fixes.each_epochs_own_progress_bar(), \
        reading.dispatcher_restarts_explained() if run.served else contextlib.nullcontext():
      part = model.fit(stream, epochs=end, initial_epoch=start, steps_per_epoch=steps,
                       validation_data=validation,
                       callbacks=_bracketed(run, callbacks), shuffle=False,
                       **fit_kwargs)
    history = _joined(history, part)
  return history


def _finish(run: _Run) -> None:
  """The model given back in the user's dtype policy (where tfdist chose half precision), then
  saved: tfdist's final model, and the user's `model.save` on the chief alone."""
  from tfdist.training import checkpoints, dtype_policy, user_files
  # Stage 3's weights stay sharded: the model never needs them whole on a worker.
  dtype_policy.give_back(run.model, run.chosen.policy, run.built_with)
  # Keras's own evaluate, predict and fit on the model run as the user compiled it.
  run.model.steps_per_execution = run.compiled_per_call
  run.model.train_function = run.model.test_function = run.model.predict_function = None
  if run.config.checkpoint.dir:
    checkpoints.save_final_model(run.model, run.config)
  user_files.save_on_chief_only(run.model, run.config)


def _parts(train, epochs: int, steps_per_epoch, first_epoch: int, first_step: int,
           epoch_steps: int | None, endless: bool = True, skippable: bool = True) -> list[tuple]:
  """(stream, first epoch, end epoch, steps per epoch) of each Keras fit: one; or, resumed
  `first_step` steps into epoch `first_epoch` (a preemption), the rest of that epoch, then the
  epochs after it, each over the stream from where it stands (`train` starts at the epoch), or
  over `train` anew when it is not `endless` (one epoch, read by Keras each epoch). A stream
  that is not `skippable` (the tf.data service's: each read a new pass) gives the rest of the
  epoch from a new pass."""
  if not (first_step and epoch_steps and first_step < epoch_steps):
    return [(train, first_epoch, epochs, steps_per_epoch)]
  rest = [(train.skip(epoch_steps) if endless else train, first_epoch + 1, epochs,
           epoch_steps if endless else steps_per_epoch)]
  return [(train.skip(first_step) if skippable else train, first_epoch, first_epoch + 1,
           epoch_steps - first_step)] + (
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


def _build(run: _Run, model_fn, compile) -> None:
  """The model built and compiled in the strategy's scope in the config's precision, with
  the settings applied (`settings`), split over devices when the config says (`hybrid`:
  averaging gradients across workers)."""
  from tfdist.training import dtype_policy
  config, strategy = run.config, run.strategy
  # Outside the scope: `auto`'s probe runs plain tensors on this process's device.
  run.chosen = settings.precision(config)
  run.built_with = settings.given_back_policy(run.chosen)
  with strategy.scope():
    model = _built_in_precision(run, model_fn)
    _require_model(model)
    from tfdist.training import in_scope
    in_scope.require_built_in_scope(
        strategy, [model], "tfdist.fit's model_fn",
        "build the model inside model_fn (tfdist.fit calls it in the strategy's scope), not "
        "before: a model made outside trains without the strategy")
    dtype_policy.keep_outputs_float32(model)
    if compile is not None:
      model.compile(**(compile() if callable(compile) else compile))
    elif not model.compiled:
      raise ModelError("model_fn returned a model that is not compiled: compile it there or "
                       "pass compile=dict(optimizer=..., loss=...)")
    if (jit := settings.jit_compile(config)) is not None:  # Else the model's own (Keras's).
      model.jit_compile = jit
    run.model, run.compiled_per_call = model, model.steps_per_execution
    run.installed = settings.install_on_optimizer(
        run.optimizer, strategy, config, settings.paths_of(config, settings.FIT))
    settings.shard_parameters([model], model.optimizer, strategy, config)
    if config.parallel.enabled:
      _split(run)


def _built_in_precision(run: _Run, model_fn):
  """`model_fn()` under the precision the config chose, said first by the chief when tfdist
  chose it; a model that does not build in a half precision `auto` chose (a layer mixing its
  own float32 tensors with bfloat16 ones, as keras-io's VAE sampling does) is built in float32
  instead, said in one line: `auto` never turns a float32 model into an error."""
  from tfdist.training import dtype_policy, report
  chosen, chief = run.chosen, is_chief(run.config)
  if chief:
    report.say(report.precision_line(chosen))
  try:
    with dtype_policy.building_with(chosen.policy):
      return model_fn()
  except Exception as error:  # noqa: BLE001  Whatever the model's code raised in half.
    if chosen.mode != "auto" or chosen.policy == FLOAT32:
      raise
    why = _first_words(error)
    run.chosen = chosen.in_float32(why)
    run.built_with = FLOAT32
    if chief:
      report.say(report.precision_line(run.chosen))
    with dtype_policy.building_with(FLOAT32):
      return model_fn()


def _first_words(error: Exception) -> str:
  """An error's type and its innermost line, without the frames Keras wraps around a layer's
  error ("Exception encountered when calling X.call()", its own "Error encountered:", the
  arguments received)."""
  import itertools
  import re
  lines = [line.strip() for line in re.sub(r"\x1b\[[0-9;]*m", "", str(error)).splitlines()
           if line.strip()]
  called = re.match(r"Exception encountered when calling (\S+?)\.?$", lines[0]) if lines else None
  if called and len(lines) > 1:
    own = list(itertools.takewhile(lambda line: not line.startswith("Arguments received"),
                                   lines[1:]))
    lines = [f"in {called.group(1)}: {own[-1] if own else lines[1]}"]
  return f"{type(error).__name__}: {lines[0] if lines else ''}"[:240]


def _require_model(model) -> None:
  import keras
  if not isinstance(model, keras.Model):
    raise ModelError("model_fn must return a Keras model (keras.Model, keras.Sequential or a "
                     "subclass) built in its body. Received: "
                     f"{'None' if model is None else type(model).__name__}")


def _split(run: _Run) -> None:
  from tfdist.training import report
  from tfdist.parallel.split_model import describe, split
  parallel, hybrid = run.config.parallel, run.hybrid
  split(run.model, parallel.stages, devices=parallel.devices or None,
        microbatches=parallel.microbatches, recompute=parallel.recompute,
        reduce_gradients=hybrid and hybrid.mean_gradients)
  if hybrid:
    hybrid.broadcast_weights(run.model)
  if is_chief(run.config):
    report.say(describe(run.model.tfdist_placement, parallel.microbatches))


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
  if settings.global_batch(config, 1) is None:  # Neither batch key set: the data decide.
    raise ConfigError("is not set, so the global batch size is unknown: set it (or "
                      "training.per_replica_batch_size)", key="training.global_batch_size",
                      source=config.source)
  hybrid = _hybrid(config)
  replicas = hybrid.workers if hybrid else make_strategy(config).num_replicas_in_sync
  return settings.global_batch(config, replicas)


def evaluate(model, x=None, y=None, *, config: ConfigLike = None, batch_size: int | None = None,
             sample_weight=None, **evaluate_kwargs):
  """`Model.evaluate` of a model built by `tfdist.fit`, under its strategy.

  Args:
    model: the model (`history.model`).
    x: as for `tfdist.fit`'s `train_data`.
    y: as for `tfdist.fit`'s `y`.
    config: gives the batch size when `batch_size` is not passed.
    batch_size: the global batch size for numpy input; default the config's, else Keras's 32.
    sample_weight: weights of the examples of array input, as for `Model.evaluate`.
    **evaluate_kwargs: the other keyword arguments of `Model.evaluate` (`steps`, `verbose`,
      `callbacks`, `return_dict`), with their Keras meaning
      (`tfdist.training.keras_arguments.EVALUATE`).

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
  from tfdist.training import data, keras_arguments, keras_fixes

  strategy = model.distribute_strategy
  batch_size = _batch(config, strategy, batch_size, data.is_arrays(x))
  keras_arguments.refuse("evaluate", {**evaluate_kwargs, "sample_weight": sample_weight},
                         _path_of(strategy))
  if _is_parameter_server(strategy):
    from tfdist.training import parameter_server
    return parameter_server.evaluate(model, data.make_dataset(x, y, strategy=None,
                                                              batch_size=batch_size,
                                                              method="evaluate"),
                                     **evaluate_kwargs)
  dataset = data.make_dataset(x, y, strategy=strategy, batch_size=batch_size,
                              sample_weight=sample_weight, method="evaluate")
  with keras_fixes.fixed_for(model, strategy, test_steps=evaluate_kwargs.get("steps")), \
      keras_fixes.own_test_step_losses(model, strategy), _calls_within(model, dataset):
    return model.evaluate(dataset, **evaluate_kwargs)


@contextlib.contextmanager
def _calls_within(model, dataset):
  """No call of compiled steps longer than the data: Keras's progress bar counts a call's
  `steps_per_execution` steps even where the data end first ("8/2"), as `fit` is kept from."""
  import tensorflow as tf
  steps = int(getattr(dataset, "cardinality", lambda: tf.constant(-1))())
  per_call = model.steps_per_execution
  if steps <= 0 or per_call <= steps:
    yield
    return
  model.steps_per_execution, model.test_function = steps, None
  try:
    yield
  finally:
    model.steps_per_execution, model.test_function = per_call, None


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
    batch_size: the global batch size; default the config's, else Keras's 32 for arrays.
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

  from tfdist.training import keras_arguments
  strategy = model.distribute_strategy
  batch_size = _batch(config, strategy, batch_size, data.is_arrays(x))
  keras_arguments.refuse("predict", predict_kwargs, _path_of(strategy))
  if _is_parameter_server(strategy):
    from tfdist.training import parameter_server
    return parameter_server.predict(model, data.make_dataset(x, strategy=None,
                                                             batch_size=batch_size,
                                                             method="predict"),
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
  dataset = data.make_dataset(x, strategy=strategy, batch_size=batch_size, method="predict")
  with keras_fixes.fixed_for(model, strategy):
    return model.predict(dataset, **predict_kwargs)


def _hybrid(config: Config):
  """The cross-worker half of a split model trained by several workers, or None."""
  if not (config.parallel.enabled and
          strategies.kind(config.strategy.name).all_reduces_across_workers):
    return None
  from tfdist.parallel.hybrid import Hybrid
  return Hybrid.for_config(config)


def _path_of(strategy) -> str:
  from tfdist.training import keras_arguments
  return (keras_arguments.PARAMETER_SERVER if _is_parameter_server(strategy)
          else keras_arguments.SYNCHRONOUS)


def _is_parameter_server(strategy) -> bool:
  import tensorflow as tf
  return isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)


def _batch(config: ConfigLike, strategy, batch_size: int | None, arrays: bool) -> int | None:
  """The batch of `evaluate`/`predict`: the argument, the config's, else Keras's default for
  numpy arrays."""
  if batch_size:
    return batch_size
  return settings.global_batch(as_config(config), strategy.num_replicas_in_sync, arrays=arrays)


def _steps_in_an_epoch(dataset, steps_per_epoch: int | None) -> int | None:
  """Steps in one epoch: the caller's, else the dataset's when it knows (None when not)."""
  if steps_per_epoch:
    return steps_per_epoch
  import tensorflow as tf
  count = int(dataset.cardinality()) if isinstance(dataset, tf.data.Dataset) else -1
  return count if count > 0 else None


def _ps_kwargs(fit_kwargs: Mapping[str, Any], config: Config) -> dict:
  """The `Model.fit` arguments tfdist's parameter-server loop takes (verbose)."""
  unsupported = sorted(set(fit_kwargs) - {"verbose"})
  if unsupported:
    raise ConfigError("is not supported under parameter_server (tfdist's coordinator loop "
                      "takes batch_size, epochs, steps_per_epoch, validation_data, callbacks "
                      "and verbose)", key=unsupported[0], received=fit_kwargs[unsupported[0]],
                      source=config.source)
  return dict(fit_kwargs)

