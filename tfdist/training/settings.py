"""One home for applying tfdist's training settings; which path honours which key is
`tfdist.config.honoured`'s table, read here to refuse.

Every path that trains calls this module and reads no `training.*` key itself: `tfdist.fit`
(Keras's loop), `tfdist.TrainingLoop` (a user's own step), the parameter-server coordinator
loop (either of them under parameter_server) and a split model (`parallel:`). A setting that a
path cannot honour is refused here, before anything is built, in one line naming the key; the
others are applied here, each key by one function (`APPLIERS`): the global batch, the epochs
and their steps, the steps per call, XLA, the dtype policy a model is built in (and given back
after), the optimizer's update (fused kernels, compressed all-reduce, periodic averaging,
accumulation, sharding), the learning-rate schedule, the seed.

```python
paths = settings.paths_of(config, settings.LOOP)     # ("tfdist.TrainingLoop",)
settings.refuse_unhonoured(config, paths)            # ConfigError naming the key, or nothing
chosen = settings.precision(config)                  # the policy to build the model in
installed = settings.install_on_optimizer(optimizer, strategy, config, paths)
```
"""

from __future__ import annotations

import contextlib
import dataclasses

import tfdist.progress as progress
from tfdist.config import honoured, rules, strategies
from tfdist.config.honoured import FIT, KERAS, LOOP, PARAMETER_SERVER, SPLIT  # noqa: F401
from tfdist.config.schema import Config
from tfdist.errors import ConfigError


APPLIERS = {
    "training.global_batch_size": "global_batch",
    "training.per_replica_batch_size": "global_batch",
    "training.epochs": "epochs",
    "training.steps_per_epoch": "steps_per_epoch",
    "training.steps_per_execution": "steps_per_execution",
    "training.jit_compile": "jit_compile",
    "training.mixed_precision": "precision",
    "training.fused_optimizer": "install_on_optimizer",
    "training.gradient_accumulation_steps": "install_on_optimizer",
    "training.zero_stage": "install_on_optimizer",
    "training.gradient_compression": "install_on_optimizer",
    "training.average_every": "install_on_optimizer",
    "training.scale_learning_rate": "learning_rate_schedule",
    "training.warmup_epochs": "learning_rate_schedule",
    "training.seed": "seed",
}
"""Each `training.*` key and the one function of this module that applies it: every training
path calls it (tests/test_training_paths.py checks both, from the schema)."""


def paths_of(config: Config, main: str) -> tuple[str, ...]:
  """The training paths a run of `config` takes: `main` (FIT or LOOP), and PARAMETER_SERVER
  or SPLIT where the config's strategy or `parallel:` section adds one. Pure."""
  extra = (PARAMETER_SERVER,) if strategies.kind(config.strategy.name).asynchronous else ()
  return (main, *extra, *((SPLIT,) if config.parallel.enabled else ()))


def refuse_unhonoured(config: Config, paths: tuple[str, ...],
                      keys: tuple[str, ...] | None = None) -> None:
  """Raises `ConfigError` for the first key of `config` that one of `paths` refuses
  (`tfdist.config.honoured`, the one table of what each path does with each key).

  Args:
    config: the run's config.
    paths: what `paths_of` returned.
    keys: the keys to look at; default every key.

  Raises:
    ConfigError: naming the key, the path and why, with the value received.
  """
  found = honoured.refusal(config, paths, keys)
  if found is not None:
    key, path, why = found
    raise ConfigError(f"is not honoured by {path}: {why}", key=key,
                      received=honoured.value(config, key), source=config.source)


def refuse_keras_distribution(paths: tuple[str, ...]) -> None:
  """Raises `ConfigError` naming `keras.distribution` when one is set: tfdist's paths take
  their strategy from the config, and a distribution beside it would be a second, silent one
  (on TensorFlow Keras ignores it: keras-team/keras#18473; after `use_keras_distribution()`
  it is the process's strategy, which the path's own would clash with).

  Args:
    paths: what `paths_of` returned; the first names the path in the message.
  """
  import keras
  chosen = keras.distribution.distribution()
  if chosen is not None:
    raise ConfigError(f"is set, and {' under '.join(paths)} takes its strategy from the "
                      "config's strategy: section: unset it with "
                      "keras.distribution.set_distribution(None), or train with Keras's own "
                      "model.fit after tfdist.use_keras_distribution()",
                      key="keras.distribution", received=type(chosen).__name__)


def hold_checkpoint_dir(config: Config):
  """This job's lease on `checkpoint.dir` (`training.lease`), taken before any path trains:
  another live job writing there is refused in one line. Returns the `Lease` to release, or
  None."""
  from tfdist.training import lease
  return lease.hold(config)


@contextlib.contextmanager
def holding_checkpoint_dir(config: Config):
  """`hold_checkpoint_dir` while inside."""
  held = hold_checkpoint_dir(config)
  try:
    yield
  finally:
    if held is not None:
      held.release()


@dataclasses.dataclass(frozen=True)
class Seeded:
  """The run's seed: `value` (also the arrays' shuffle's; None: `data`'s default) and, where the
  script seeded Keras itself with another seed than `training.seed`, the start line's `note`
  saying the script's won."""
  value: int | None
  note: str | None = None


_SEEDED_BY_TFDIST: list[int] = []  # Keras's global seeds tfdist itself set in this process.


def seed(config: Config) -> Seeded:
  """Seeds Python, NumPy and TensorFlow with `training.seed` (Keras's `set_random_seed`), when
  set and the script has not seeded Keras itself: a script's own
  `keras.utils.set_random_seed(s)` wins (a config's seed re-seeding before `model_fn` made
  other initial weights than the script's, silently), and the start line says so. Applied
  after the strategy is made (it may need TensorFlow unstarted), before any model.

  Returns:
    The `Seeded` in effect.
  """
  from keras.src.utils import rng_utils
  chosen, own = config.training.seed, rng_utils.get_random_seed()
  if own is not None and own not in _SEEDED_BY_TFDIST:  # The script's own seed.
    note = None if chosen in (None, own) else (
        f"the script's seed {own} (keras.utils.set_random_seed), not training.seed {chosen}")
    return Seeded(own, note)
  if chosen is not None:
    import keras
    keras.utils.set_random_seed(chosen)
    _SEEDED_BY_TFDIST.append(chosen)
  return Seeded(chosen)


def global_batch(config: Config, replicas: int, given: int | None = None,
                 arrays: bool = False) -> int | None:
  """The run's global batch: `given` (a `batch_size=` argument, checked as the config's is),
  else `training.global_batch_size` or `per_replica_batch_size` x `replicas`, else for numpy
  arrays Keras's default (`data.KERAS_BATCH_SIZE`, 32); None where only the data can say.

  Raises:
    ConfigError: a batch that does not split evenly over the replicas.
  """
  from tfdist.config.batch import batch_sizes
  from tfdist.training import data
  if given is None:
    configured = batch_sizes(config.training, replicas).global_batch_size
    if configured is not None or not arrays:
      return configured
    if data.KERAS_BATCH_SIZE % replicas:
      raise ConfigError(f"is not set, and Keras's default batch of {data.KERAS_BATCH_SIZE} "
                        f"does not split over the {replicas} replicas: pass batch_size or set "
                        "it", key="training.global_batch_size", source=config.source)
    return data.KERAS_BATCH_SIZE
  if not isinstance(given, int) or isinstance(given, bool) or given < 1 or given % replicas:
    raise ConfigError(f"must be a positive multiple of the {replicas} replicas (each replica "
                      "takes an equal share of a global batch)", key="batch_size",
                      received=given)
  return given


def epochs(config: Config, given: int | None = None) -> int:
  """The epochs to train: `given` (an `epochs=` argument) wins over `training.epochs`."""
  return config.training.epochs if given is None else given


def steps_per_epoch(config: Config, given: int | None = None) -> int | None:
  """Steps in an epoch: `given` (a `steps_per_epoch=`/`steps=` argument), else
  `training.steps_per_epoch`; None where the data give it."""
  return given or config.training.steps_per_epoch


def jit_compile(config: Config) -> bool | None:
  """Whether the training step is compiled by XLA (`training.jit_compile`; refused where a
  strategy or a split cannot, by `config.honoured`); None for `auto`: the model's own
  `compile(jit_compile=...)`, Keras's rule when it was left "auto"."""
  chosen = config.training.jit_compile
  return None if chosen == "auto" else chosen


def learning_rate_schedule(optimizer, config: Config, replicas: int,
                           epoch_steps: int | None) -> None:
  """`training.scale_learning_rate` (the rate times `replicas`) and `training.warmup_epochs`
  (a linear ramp over that many epochs of `epoch_steps`), as one schedule around the
  optimizer's own rate (`training.schedule`); nothing when neither is asked.

  Raises:
    ConfigError: a warm-up with no known length of an epoch.
  """
  training = config.training
  if not (training.scale_learning_rate or training.warmup_epochs):
    return
  if training.warmup_epochs and not epoch_steps:
    raise ConfigError("needs the number of steps in an epoch, which the data do not give: "
                      "set training.steps_per_epoch (tfdist.fit also takes steps_per_epoch=)",
                      key="training.warmup_epochs", received=training.warmup_epochs,
                      source=config.source)
  from tfdist.training import schedule
  schedule.scale_learning_rate(getattr(optimizer, "inner_optimizer", optimizer),
                               replicas if training.scale_learning_rate else 1,
                               training.warmup_epochs * (epoch_steps or 0))


def steps_per_execution(config: Config, compiled: int = 1) -> int:
  """Training steps in one call of the compiled function: the model's own
  `compile(steps_per_execution=N)` where the user set one (Keras's default is 1) and the config
  leaves `training.steps_per_execution` at its default; else the config's.

  Raises:
    ConfigError: the config and the model's compile ask for two different counts.
  """
  from tfdist.config import schema
  configured = config.training.steps_per_execution
  if compiled in (1, configured):
    return configured
  default = schema.TrainingConfig.__dataclass_fields__["steps_per_execution"].default
  if configured != default:
    raise ConfigError(f"differs from the model's compile(steps_per_execution={compiled}): "
                      "set one of them", key="training.steps_per_execution",
                      received=configured, source=config.source)
  return compiled


def precision(config: Config):
  """The `machine.precision.Precision` the run builds its model in: the config's
  `training.mixed_precision` (`auto` measured on this machine)."""
  from tfdist.machine import precision as precision_lib
  return precision_lib.policy_for(config.training.mixed_precision,
                                  loss_scaling=rules.loss_scaling(config.strategy.name))


def given_back_policy(chosen) -> str:
  """The dtype policy the run's models compute in once training ends, from what `precision`
  chose: Keras's global policy now (the one the user builds with) where tfdist chose a half
  precision itself (`auto`), else the chosen one (a policy the user chose is kept)."""
  import keras
  from tfdist.machine import precision as precision_lib
  if chosen.mode == "auto" and chosen.policy != precision_lib.FLOAT32:
    return keras.config.dtype_policy().name
  return chosen.policy


@dataclasses.dataclass(frozen=True)
class Installed:
  """What `install_on_optimizer` put on the run's optimizer.

  Attributes:
    fused: the name of the optimizer whose update is fused, or None.
    accumulation: batches whose gradients make one update (1: none).
    averaging: the `local_sgd.Averaging` callback periodic averaging needs, or None.
  """
  fused: str | None
  accumulation: int
  averaging: object | None


def install_on_optimizer(optimizer, strategy, config: Config, paths: tuple[str, ...]
                         ) -> Installed:
  """Applies the config's optimizer settings to `optimizer` (its inner optimizer under loss
  scaling): fused updates, a compressed all-reduce, periodic averaging (its own gradients and
  its callback), Keras's gradient accumulation (with tfdist's fix where the strategy needs it)
  and the sharded optimizer's stages.

  Args:
    optimizer: the Keras optimizer the run updates with.
    strategy: the run's strategy.
    config: the run's config.
    paths: what `paths_of` returned.

  Returns:
    `Installed`.
  """
  from tfdist.training import fused_updates, keras_fixes
  inner = getattr(optimizer, "inner_optimizer", optimizer)
  training = config.training
  # A sharded optimizer updates a shard held in no variable: Keras's own update, unfused.
  fused = (training.fused_optimizer and not training.zero_stage and
           fused_updates.install(inner))
  compressed = config.training.gradient_compression
  if compressed != "none":
    from tfdist.training import compression
    compression.install(inner, compressed)
  averaging = None
  if config.training.average_every:
    from tfdist.training import local_sgd
    local_sgd.install(inner, strategy)
    averaging = local_sgd.Averaging(strategy, config.training.average_every)
  if training.gradient_accumulation_steps > 1:
    inner.gradient_accumulation_steps = training.gradient_accumulation_steps
    if LOOP in paths:  # tfdist.fit's step loop lays accumulation out itself (keras_fixes).
      keras_fixes.accumulate_outside_cond(inner, strategy)
  if training.zero_stage:
    _shard(optimizer, strategy, config, training.zero_stage)
  keras_fixes.fix_optimizer_arguments(inner, strategy)  # Clipping, EMA: one device's meaning.
  return Installed(fused=type(inner).__name__ if fused else None,
                   accumulation=training.gradient_accumulation_steps, averaging=averaging)


def _shard(optimizer, strategy, config: Config, stage: int) -> None:
  """Stages 1 and 2 installed on `optimizer`; stage 3 marked there, for `shard_parameters`."""
  from tfdist.training import sharded_optimizer
  inner = getattr(optimizer, "inner_optimizer", optimizer)
  why = sharded_optimizer.refusal(optimizer, gradients=stage >= 2)
  if why is None and inner.built:
    why = "the optimizer was already built (shard it before its first step)"
  if why:
    raise ConfigError(f"cannot shard this optimizer: {why}", key="training.zero_stage",
                      received=type(inner).__name__, source=config.source)
  sharded_optimizer.install(optimizer, strategy, gradients=stage >= 2)
  inner.tfdist_shards.parameters = stage == 3


def shard_parameters(models, optimizer, strategy, config: Config) -> None:
  """Shards the trainable weights of the model `optimizer` updates (`models`, one) over the
  replicas (ZeRO stage 3, `training.zero_stage: 3`) after `install_on_optimizer` installed
  stage 2 and marked stage 3 on the optimizer; nothing below stage 3.

  Raises:
    ConfigError: naming the key, when the model or its optimizer cannot be sharded.
  """
  shards = getattr(getattr(optimizer, "inner_optimizer", optimizer), "tfdist_shards", None)
  if shards is None or not shards.parameters:
    return
  from tfdist.training import sharded_parameters
  if len(models) != 1:
    raise ConfigError(f"shards the weights of the one model an optimizer updates; this one "
                      f"updates {len(models)} models' weights", key="training.zero_stage",
                      received=3, source=config.source)
  model = models[0]
  why = sharded_parameters.refusal(model, optimizer)
  if why:
    raise ConfigError(f"cannot shard this model's weights: {why}",
                      key="training.zero_stage", received=3, source=config.source)
  sharded_parameters.install(model, optimizer, strategy)


def _votes_across_workers(config: Config) -> bool:
  """Whether the run's workers must agree after a call (MultiWorkerMirrored's lockstep)."""
  return strategies.kind(config.strategy.name).all_reduces_across_workers and \
      bool(config.cluster.jobs)


def data_service(config: Config) -> str | None:
  """The tf.data service's dispatcher that tfdist.fit and tfdist.TrainingLoop read the training
  dataset through ("grpc://host:port"), or None where the cluster has none.

  Raises:
    ConfigError: a dispatcher without its address (a task not started by tfdist launch).
  """
  if not config.cluster.dispatcher:
    return None
  from tfdist.data_service import data_service_address
  return data_service_address(config)


def backup_cadence(config: Config, strategy):
  """When step backups are taken (`checkpoint.backup_every_steps` within
  `checkpoint.backup_budget`): a `backup_cadence.Cadence`, every worker voting under
  multi_worker_mirrored. The asynchronous parameter-server loop takes none within epochs."""
  from tfdist.training import agreement
  from tfdist.training.backup_cadence import Cadence
  every = 0 if strategies.kind(config.strategy.name).asynchronous else \
      config.checkpoint.backup_every_steps
  vote = None
  if _votes_across_workers(config):
    vote = agreement.Vote(strategy, progress.Collective.BACKUP_AGREEMENT).every
  return Cadence(every, config.checkpoint.backup_budget, vote=vote)


def preemption_notice(config: Config, strategy):
  """The `preemption.Notice` of a run with a `checkpoint.dir` (SIGTERM and
  `checkpoint.preemption_signal`; every worker agrees under multi_worker_mirrored), or None:
  without a checkpoint.dir there is nothing to save."""
  if not config.checkpoint.dir:
    return None
  from tfdist.training import preemption
  return preemption.Notice(preemption.signals_of(config.checkpoint.preemption_signal),
                           strategy=strategy if _votes_across_workers(config) else None)
