"""Rules that span sections of a config: a task against its cluster, a strategy against its
cluster, batch settings against each other.

TensorFlow accepts most of these mistakes without a word and then hangs or silently trains on
one worker (see BUILD_NOTES.md); tfdist refuses them before TensorFlow is imported.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

from tfdist.config import honoured, strategies
from tfdist.config.schema import Config, ParallelConfig, StrategyConfig
from tfdist.config.tf_config import split_address
from tfdist.errors import ConfigError


def infer_strategy(config: Config) -> Config:
  """Fills in a strategy the config left out, from its cluster."""
  if config.strategy is not None:
    return config
  name = strategies.inferred(config.cluster)
  return dataclasses.replace(config, strategy=StrategyConfig(name, strategies.kind(name).options()))


def check(config: Config) -> None:
  """Raises `ConfigError` for the first rule `config` breaks."""
  try:
    _check_cluster(config)
    _check_task(config)
    _check_strategy(config)
    _check_training(config)
    _check_parallel(config)
    _check_devices(config)
  except ConfigError as e:
    raise e.from_source(config.source) from None


def check_unique_addresses(addresses: Mapping[str, tuple[str, ...]], key: str = "cluster") -> None:
  seen = {}
  for job, job_addresses in addresses.items():
    for i, address in enumerate(job_addresses):
      host, port = split_address(address)
      where = f"{key}.{job}[{i}]"
      if (host, port) in seen:
        raise ConfigError(f"must differ from every other address; {seen[host, port]} has it too",
                          key=where, received=address)
      seen[host, port] = where


def _check_cluster(config: Config) -> None:
  cluster = config.cluster
  for job in ("chief", "evaluator", "dispatcher"):
    if cluster.count(job) > 1:
      raise ConfigError(f"a cluster has at most one {job}", key=f"cluster.{job}",
                        received=cluster.count(job))
  if bool(cluster.dispatcher) != bool(cluster.data_worker):
    key, other = ("cluster.dispatcher", "data_worker") if cluster.dispatcher else \
        ("cluster.data_worker", "dispatcher")
    raise ConfigError(f"the tf.data service needs a dispatcher and data workers: give "
                      f"cluster.{other} too", key=key, received=cluster.count(key[8:]))
  if cluster.dispatcher and not cluster.training_tasks:
    raise ConfigError("the tf.data service feeds trainers: give the cluster a chief or "
                      "workers", key="cluster.dispatcher", received=cluster.dispatcher)
  for key, what in _NEED_THE_SERVICE.items():
    if honoured.asked(config, key) and not cluster.dispatcher:
      raise ConfigError(f"{what}: give the cluster cluster.dispatcher and cluster.data_worker, "
                        "or leave it out", key=key, received=honoured.value(config, key))


_NEED_THE_SERVICE = {
    "data_service.work_dir": "is the tf.data service dispatcher's journal",
    "data_service.passes": "says how trainers read through the tf.data service"}
"""The `data_service` keys, each with what it is: meaningless without the service's roles."""


def refuse_data_service(config: Config, where: str) -> None:
  """Refuses a cluster with the tf.data service's roles where they cannot be placed (`where`:
  "a TFJob (--kind tfjob)"), in one line naming `cluster.dispatcher`."""
  if config.cluster.dispatcher:
    raise ConfigError(f"the tf.data service's roles are launched by tfdist launch (every "
                      f"backend, and per host with --task) and by tfdist export kubernetes's "
                      f"JobSet and StatefulSets; {where} has no place for them",
                      key="cluster.dispatcher", source=config.source,
                      received=config.cluster.dispatcher)


def _check_task(config: Config) -> None:
  task, cluster = config.task, config.cluster
  if task is None:
    return
  if cluster.is_empty:
    raise ConfigError("is set but the cluster is empty; TensorFlow would silently train on one "
                      "worker: give the cluster too", key="task", received=str(task))
  if task.type not in cluster.jobs:
    raise ConfigError(f"must be a job of the cluster ({', '.join(cluster.jobs)})",
                      key="task.type", received=task.type)
  if not 0 <= task.index < cluster.count(task.type):
    raise ConfigError(f"must be from 0 to {cluster.count(task.type) - 1}: the cluster has "
                      f"{cluster.count(task.type)} {task.type} task(s)", key="task.index",
                      received=task.index)


def _check_strategy(config: Config) -> None:
  name, cluster = config.strategy.name, config.cluster
  training = config.training
  if training.average_every and training.gradient_compression != "none":
    raise ConfigError("must be none with average_every: periodic averaging all-reduces no "
                      "gradients", key="training.gradient_compression",
                      received=training.gradient_compression)
  unsupported = honoured.unsupported(config)  # What a key needs of the strategy: the table's.
  if unsupported:
    key, why = unsupported
    raise ConfigError(why, key=key, received=honoured.value(config, key))
  kind = strategies.kind(name)
  if not kind.across_workers and (cluster.training_tasks > 1 or cluster.ps):
    raise ConfigError(f"{name} runs on one machine; a cluster of {cluster.training_tasks} "
                      f"training tasks needs {strategies.across_workers(False)} (or "
                      f"{strategies.across_workers(True)} with ps tasks)", key="strategy.name",
                      received=name)
  if kind.all_reduces_across_workers and cluster.ps:
    raise ConfigError(f"{name} takes no ps tasks (TensorFlow waits forever for them); remove "
                      f"cluster.ps or use {strategies.across_workers(True)}", key="cluster.ps",
                      received=cluster.ps)
  if kind.asynchronous:
    if config.cluster.is_empty:
      return  # Cluster from TF_CONFIG or `tfdist launch` later; checked then.
    for job, rule in (("ps", "at least one ps task"), ("worker", "at least one worker task"),
                      ("chief", "one chief task, the coordinator that runs the training script")):
      if not cluster.count(job):
        raise ConfigError(f"{name} needs {rule}", key=f"cluster.{job}",
                          received=cluster.count(job))
    if config.strategy.options.max_shards > 1:
      raise ConfigError("must be 1: Keras 3 optimizers cannot update sharded variables "
                        "('ShardedVariable' object has no attribute 'handle')",
                        key="strategy.max_shards", received=config.strategy.options.max_shards)
    shard_bytes = config.strategy.options.min_shard_bytes
    if shard_bytes != type(config.strategy.options)().min_shard_bytes:
      raise ConfigError("needs strategy.max_shards above 1, which Keras 3 cannot train (see "
                        "strategy.max_shards): nothing is sharded", key="strategy.min_shard_bytes",
                        received=shard_bytes)


def _check_training(config: Config) -> None:
  training = config.training
  signal_name = config.checkpoint.preemption_signal
  if signal_name != "SIGTERM" and not config.checkpoint.dir:
    raise ConfigError("needs checkpoint.dir: a preemption notice saves each task's backup "
                      "there", key="checkpoint.preemption_signal", received=signal_name)
  if training.zero_stage == 3 and training.gradient_accumulation_steps > 1:
    # The run's own refusal of a model (sharded_parameters.refusal) says it too; here the
    # config says it first, so `tfdist check` refuses what training would.
    raise ConfigError("stage 3 cannot be combined with training.gradient_accumulation_steps "
                      "above 1: gradient accumulation keeps a whole accumulator of every "
                      "weight on every replica", key="training.zero_stage", received=3)
  if training.zero_stage:
    _check_sharding(config)
  if training.global_batch_size is not None and training.per_replica_batch_size is not None:
    raise ConfigError("give global_batch_size or per_replica_batch_size, not both",
                      key="training.per_replica_batch_size",
                      received=training.per_replica_batch_size)


def loss_scaling(name: str) -> bool:
  """Whether float16's loss scaling works under strategy `name`."""
  return "loss_scaling" in strategies.kind(name).supports


def _check_sharding(config: Config) -> None:
  for key in ("gradient_compression", "average_every"):
    if getattr(config.training, key) not in ("none", 0):
      raise ConfigError(f"cannot be combined with training.{key}: the shards are updated from "
                        "gradients all-reduced in their own dtype every step",
                        key="training.zero_stage", received=config.training.zero_stage)


def _check_devices(config: Config) -> None:
  devices = config.devices
  if devices.logical_gpus > 1 and devices.logical_cpus > 1:
    raise ConfigError("cannot be combined with devices.logical_cpus (a process runs on CPU "
                      "devices or on GPU devices)", key="devices.logical_gpus",
                      received=devices.logical_gpus)
  if devices.logical_gpus > 1 and getattr(config.strategy.options, "cross_device_ops",
                                          None) == "nccl":
    raise ConfigError("must not be nccl with devices.logical_gpus: NCCL cannot put two ranks "
                      "on one GPU; use auto (hierarchical_copy there)",
                      key="strategy.cross_device_ops", received="nccl")


def _check_parallel(config: Config) -> None:
  # Which training settings a split honours is config.honoured's (one home for them).
  if not config.parallel.enabled:
    for key in ("devices", "microbatches", "recompute"):
      if getattr(config.parallel, key) != getattr(ParallelConfig(), key):
        raise ConfigError("needs parallel.stages: nothing is split without it",
                          key=f"parallel.{key}", received=getattr(config.parallel, key))
    return
