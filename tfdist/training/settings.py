"""One home for applying tfdist's training settings; which path honours which key is
`tfdist.config.honoured`'s table, read here to refuse.

Every path that trains calls this module and installs nothing itself: `tfdist.fit` (Keras's
loop), `tfdist.TrainingLoop` (a user's own step), the parameter-server coordinator loop (either
of them under parameter_server) and a split model (`parallel:`). A setting that a path cannot
honour is refused here, before anything is built, in one line naming the key; the others are
applied here: the dtype policy a model is built in (and given back after), the optimizer's
update (fused kernels, compressed all-reduce, periodic averaging, accumulation), the
preemption notice, the steps per call.

```python
paths = settings.paths_of(config, settings.LOOP)     # ("tfdist.TrainingLoop",)
settings.refuse_unhonoured(config, paths)            # ConfigError naming the key, or nothing
chosen = settings.precision(config)                  # the policy to build the model in
fused = settings.install_on_optimizer(optimizer, strategy, config, paths)
```
"""

from __future__ import annotations

import contextlib

from tfdist.config import honoured, rules, strategies
from tfdist.config.honoured import FIT, KERAS, LOOP, PARAMETER_SERVER, SPLIT  # noqa: F401
from tfdist.config.schema import Config
from tfdist.errors import ConfigError


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


def seed(config: Config) -> None:
  """Seeds Python, NumPy and TensorFlow with `training.seed` (Keras's `set_random_seed`), when
  set: after the strategy is made (it may need TensorFlow unstarted), before any model."""
  if config.training.seed is not None:
    import keras
    keras.utils.set_random_seed(config.training.seed)


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


def given_back_policy(config: Config, chosen) -> str:
  """The dtype policy the run's models compute in once training ends: Keras's global policy
  (the one the user built with) where tfdist chose a half precision itself (`auto`), else
  `chosen`'s (a policy the user chose is kept)."""
  import keras
  from tfdist.machine import precision as precision_lib
  if config.training.mixed_precision == "auto" and chosen.policy != precision_lib.FLOAT32:
    return keras.config.dtype_policy().name
  return chosen.policy


def install_on_optimizer(optimizer, strategy, config: Config, paths: tuple[str, ...]
                         ) -> str | None:
  """Applies the config's optimizer settings to `optimizer` (its inner optimizer under loss
  scaling): fused updates, a compressed all-reduce, periodic averaging's own gradients, and
  Keras's gradient accumulation (with tfdist's fix where the strategy needs it).

  Args:
    optimizer: the Keras optimizer the run updates with.
    strategy: the run's strategy.
    config: the run's config.
    paths: what `paths_of` returned.

  Returns:
    The name of the optimizer whose update is fused, or None.
  """
  from tfdist.training import fused_updates, keras_fixes
  inner = getattr(optimizer, "inner_optimizer", optimizer)
  training = config.training
  # A sharded optimizer updates a shard held in no variable: Keras's own update, unfused.
  fused = (training.fused_optimizer and not training.shard_optimizer and
           fused_updates.install(inner))
  compressed = config.training.gradient_compression
  if compressed != "none":
    from tfdist.training import compression
    compression.install(inner, compressed)
  if config.training.average_every:
    from tfdist.training import local_sgd
    local_sgd.install(inner, strategy)
  if training.gradient_accumulation_steps > 1:
    inner.gradient_accumulation_steps = training.gradient_accumulation_steps
    if LOOP in paths:  # tfdist.fit's step loop lays accumulation out itself (keras_fixes).
      keras_fixes.accumulate_outside_cond(inner, strategy)
  if training.shard_optimizer:
    _shard(optimizer, strategy, config)
  return type(inner).__name__ if fused else None


def _shard(optimizer, strategy, config: Config) -> None:
  from tfdist.training import sharded_optimizer
  why = sharded_optimizer.refusal(optimizer)
  if why is None and getattr(optimizer, "inner_optimizer", optimizer).built:
    why = "the optimizer was already built (shard it before its first step)"
  if why:
    raise ConfigError(f"cannot shard this optimizer: {why}", key="training.shard_optimizer",
                      received=type(getattr(optimizer, "inner_optimizer", optimizer)).__name__,
                      source=config.source)
  sharded_optimizer.install(optimizer, strategy, gradients=config.training.shard_gradients)


def averaging(strategy, config: Config):
  """The `local_sgd.Averaging` callback of `training.average_every`, or None."""
  every = config.training.average_every
  if not every:
    return None
  from tfdist.training import local_sgd
  return local_sgd.Averaging(strategy, every)


def preemption_notice(config: Config, strategy):
  """The `preemption.Notice` of a run with a `checkpoint.dir` (SIGTERM and
  `checkpoint.preemption_signal`; every worker agrees under multi_worker_mirrored), or None:
  without a checkpoint.dir there is nothing to save."""
  if not config.checkpoint.dir:
    return None
  from tfdist.training import preemption
  multi_worker = (strategies.kind(config.strategy.name).all_reduces_across_workers and
                  bool(config.cluster.jobs))
  return preemption.Notice(preemption.signals_of(config.checkpoint.preemption_signal),
                           strategy=strategy if multi_worker else None)
