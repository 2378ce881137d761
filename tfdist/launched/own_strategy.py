"""A launched script's own strategy, as TensorFlow's and Keras's guides write it:
`tf.distribute.MultiWorkerMirroredStrategy()`, `MirroredStrategy()`,
`ParameterServerStrategy(resolver)` made by the script itself rather than by `tfdist.fit`.

Under `tfdist launch` the task's strategy is made when TensorFlow is imported (its devices,
cluster server and collectives must come first); the script's own strategy then

- runs as plain TensorFlow runs it with the task's TF_CONFIG when it is of the config's kind
  (a multi-worker strategy in each worker of a cluster, one process's strategy in a process
  of its own);
- on a parameter-server chief, is the strategy already connected to the cluster (a second one
  started the chief's server again on its port: "Could not start gRPC server"), with the
  script's `variable_partitioner`;
- is refused in one line naming both when it is not of the config's kind: one process's
  strategy in each worker of a cluster trains each worker alone (and `MirroredStrategy()`
  made after the task's collectives died of SIGSEGV in `_make_collective_ops_with_fallbacks`).

The chief says once, in one line, what tfdist does to such a script (`start_line`).
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable

from tfdist.config import strategies
from tfdist.config.roles import is_chief
from tfdist.config.schema import Config
from tfdist.errors import ConfigError
from tfdist.strategy import factory


def install(config: Config, say: Callable[[str], None]) -> None:
  """Guards the constructor of every `tf.distribute` strategy a script may make in this
  launched task (`StrategyKind.tf_class`); the first one the script makes has `say` called
  with the start line on the chief. Idempotent.

  Args:
    config: the launched task's config.
    say: prints a line on the terminal.

  Example:

  ```python
  own_strategy.install(tfdist.load_config(), print)   # at a launched task's import
  strategy = tf.distribute.MultiWorkerMirroredStrategy()   # the script's own: checked, said
  ```
  """
  import tensorflow as tf
  said = []

  def first_made(kind):
    if not said and is_chief(config):
      say(start_line(config, kind))
    said.append(kind)
  for kind in strategies.KINDS.values():
    if kind.tf_class is None:
      continue
    cls = functools.reduce(getattr, kind.tf_class.split("."), tf.distribute)
    if getattr(cls.__init__, "tfdist_guarded", False):
      continue
    cls.__init__ = _guarded(cls.__init__, kind, config, first_made)
    if kind.asynchronous:
      cls.__new__ = _the_connected_one(kind, config)


def _guarded(init, made: strategies.StrategyKind, config: Config, first_made):
  @functools.wraps(init)
  def guarded(strategy, *args, **kwargs):
    if factory.making():
      return init(strategy, *args, **kwargs)
    refusal(made, config)
    given = inspect.signature(init).bind(strategy, *args, **kwargs).arguments
    if made.asynchronous:  # The connected strategy itself (`__new__`): not made again.
      _check_cluster(given.get("cluster_resolver"), config)
      strategy.extended._variable_partitioner = given.get("variable_partitioner")
    else:
      init(strategy, *args, **kwargs)
    first_made(made)
  guarded.tfdist_guarded = True
  return guarded


def _the_connected_one(made: strategies.StrategyKind, config: Config):
  """The parameter-server strategy class's `__new__`: a script gets the task's strategy,
  already connected (Python then calls `__init__` on it: `_guarded` makes nothing again)."""
  def new(klass, *args, **kwargs):
    if factory.making():
      return object.__new__(klass)
    refusal(made, config)
    return factory.make_strategy(config)
  return new


def refusal(made: strategies.StrategyKind, config: Config) -> None:
  """Refuses, in one line naming both, a script's own strategy of another kind than the
  config's: one process's strategy in a worker of a cluster of several, a multi-worker
  strategy other than the cluster's, a parameter-server strategy without parameter servers.

  Args:
    made: the kind of strategy the script makes.
    config: the launched task's config.

  Raises:
    ConfigError: `made` does not run the config's tasks as its kind would.

  Example:

  ```python
  refusal(strategies.kind("mirrored"), config)   # in a worker of 2: ConfigError
  ```
  """
  own = strategies.kind(config.strategy.name)
  workers = config.cluster.training_tasks
  if own.across_workers and (workers > 1 or own.asynchronous):
    if made == own:
      return
    where = (f"its chief coordinates {config.cluster.worker} workers and "
             f"{config.cluster.ps} ps tasks" if own.asynchronous else
             f"{workers} workers train together")
    alone = ("the workers and ps tasks would be left idle" if own.asynchronous else
             "each worker would train alone" if not made.across_workers else
             "it needs parameter servers")
  elif made.asynchronous:
    where, alone = "one process trains, with no parameter servers", "it needs a cluster of them"
  else:
    return
  raise ConfigError(
      f"is {own.name}: {where}, but the script makes tf.distribute.{made.tf_class}, and "
      f"{alone}. Make {_make(own)} in the script, or launch a config whose strategy is "
      f"{made.name}", key="strategy.name", received=f"tf.distribute.{made.tf_class}(...)",
      source=config.source)


def _make(kind: strategies.StrategyKind) -> str:
  return f"tf.distribute.{kind.tf_class}()" if kind.tf_class else "no strategy"


def _check_cluster(resolver, config: Config) -> None:
  """A script's parameter-server strategy given a cluster other than the launch's (its own
  in-process servers, as the tutorial's first section makes) is refused: the task's server
  already serves the launch's cluster."""
  from tfdist.strategy.resolver import cluster_resolver
  if resolver is None:
    return
  jobs = lambda spec: {job: sorted(tasks) for job, tasks in spec.as_dict().items()
                       if job in ("chief", "worker", "ps")}
  given, launched = jobs(resolver.cluster_spec()), jobs(cluster_resolver(config).cluster_spec())
  if given != launched:
    raise ConfigError(
        "the script's tf.distribute.ParameterServerStrategy names a cluster other than the "
        f"launch's ({launched}): under tfdist launch each task's server serves the launch's "
        "cluster; pass tf.distribute.cluster_resolver.TFConfigClusterResolver() (its TF_CONFIG)",
        key="cluster", received=given, source=config.source)


def start_line(config: Config, made: strategies.StrategyKind) -> str:
  """What tfdist does to a script that makes its own strategy, said once by the chief. Pure.

  Args:
    config: the launched task's config.
    made: the kind of strategy the script made first.

  Returns:
    The line.

  Example:

  ```python
  print(start_line(config, strategies.kind("multi_worker_mirrored")))
  ```
  """
  import keras
  tasks, cluster = config.cluster.training_tasks, config.cluster
  if made.asynchronous:
    over = (f" over the launch's chief, {cluster.worker} workers and {cluster.ps} ps tasks, "
            "as plain TensorFlow runs it with the task's TF_CONFIG")
  elif made.across_workers and tasks > 1:
    over = (f" over the launch's {tasks} workers, as plain TensorFlow runs it with the task's "
            "TF_CONFIG")
  else:
    over = " on this process's devices, as plain TensorFlow runs it"
  done = ["Keras's fit, evaluate and predict with tfdist's Keras 3 fixes"]
  if made.across_workers and tasks > 1 and not made.asynchronous:
    done += ["each file a Keras callback writes written once, by the chief "
             "(BackupAndRestore: a folder per task)",
             "a worker's load of a file after the chief's save of it"]
  if made.asynchronous:
    done = ["the launch's strategy, connected to its cluster at import",
            "Keras's model.fit run by tfdist's ClusterCoordinator loop (Keras 3 has none)"]
  return (f"tfdist: the script's own tf.distribute.{made.tf_class}{over}, and "
          f"{'; '.join(done)}. The config's "
          f"training keys apply to tfdist.fit alone: this script's precision "
          f"({keras.config.dtype_policy().name}), seed and batch are its own")
