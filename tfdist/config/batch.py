"""Replica counts and batch sizes, predicted from a config without TensorFlow.

`tfdist check` prints these before anything starts; the training wrapper uses the strategy's
own `num_replicas_in_sync` and the same `batch_sizes` arithmetic.
"""

from __future__ import annotations

import dataclasses

from tfdist.config import strategies
from tfdist.config.schema import Config, TrainingConfig
from tfdist.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class BatchSizes:
  """Examples per training step.

  Attributes:
    replicas: replicas that each take a share of a step's batch.
    global_batch_size: examples per step over all replicas; None when the config gives none.
    per_replica_batch_size: examples per step on each replica; None likewise.

  Example:

  ```python
  import tfdist
  sizes = tfdist.batch_sizes(tfdist.load_config({"training": {"global_batch_size": 64}})
                             .training, replicas=2)
  print(sizes)   # BatchSizes(replicas=2, global_batch_size=64, per_replica_batch_size=32)
  ```
  """
  replicas: int
  global_batch_size: int | None
  per_replica_batch_size: int | None


def replica_count(config: Config, local_gpus: int = 0) -> int:
  """How many replicas the config's strategy will have.

  Args:
    config: a validated config.
    local_gpus: GPUs on each machine (every machine of a cluster is assumed alike).

  Returns:
    The replica count. A parameter-server step runs on one worker at a time, so its replicas
    are that worker's devices; logical CPU devices count only for the single-machine
    strategies that use them.

  Example:

  ```python
  import tfdist
  config = tfdist.load_config({"strategy": "multi_worker_mirrored",
                               "cluster": {"worker": 4}})
  tfdist.replica_count(config, local_gpus=2)   # 8
  ```
  """
  kind = strategies.kind(config.strategy.name)
  if kind.replicas == "local":
    listed = getattr(config.strategy.options, kind.devices_option)
    return len(listed) or local_gpus or max(config.devices.logical_cpus, 1)
  if kind.replicas == "workers":
    return max(config.cluster.training_tasks, 1) * max(local_gpus, 1)
  if kind.replicas == "worker":
    return max(local_gpus, 1)
  return 1


def batch_sizes(training: TrainingConfig, replicas: int) -> BatchSizes:
  """Derives the global and per-replica batch sizes from whichever the config gives.

  Args:
    training: the config's `training` section (`global_batch_size` or
      `per_replica_batch_size`).
    replicas: the strategy's replica count (`replica_count`, or the strategy's
      `num_replicas_in_sync`).

  Returns:
    A `BatchSizes`.

  Raises:
    ConfigError: the global batch does not split evenly over the replicas.

  Example:

  ```python
  import tfdist
  training = tfdist.load_config({"training": {"per_replica_batch_size": 16}}).training
  tfdist.batch_sizes(training, replicas=4).global_batch_size   # 64
  ```
  """
  global_batch, per_replica = training.global_batch_size, training.per_replica_batch_size
  if per_replica is not None:
    global_batch = per_replica * replicas
  elif global_batch is not None:
    if global_batch % replicas:
      raise ConfigError(f"must be a multiple of the {replicas} replicas",
                        key="training.global_batch_size", received=global_batch)
    per_replica = global_batch // replicas
  return BatchSizes(replicas, global_batch, per_replica)
