"""`tfdist check CONFIG [--task TYPE:INDEX]`: validate a config and show what it will do.

A bad config fails before TensorFlow is imported. TensorFlow is imported only to count this
machine's GPUs when the replica count depends on them.
"""

from __future__ import annotations

import dataclasses
import json

import yaml

from tfdist.config import (LOCALHOST, batch_sizes, config_to_dict, load_config, replica_count,
                           tf_config_for)
from tfdist.config.schema import Config

USAGE = "tfdist check [CONFIG] [--task TYPE:INDEX]"


def run(args: list[str], task: str | None) -> int:
  if len(args) > 1:
    raise SystemExit(f"usage: {USAGE}")
  config = load_config(args[0] if args else None, task=task)
  print(render(config, _gpus_if_needed(config), _policy(config)))
  return 0


def render(config: Config, local_gpus: int, policy: str | None = None) -> str:
  """The report `tfdist check` prints: normalised config, TF_CONFIG per task, batch sizes, and
  the dtype policy `training.mixed_precision` means on this machine."""
  lines = [f"{config.source or 'config'}: valid", "", "normalised config:"]
  lines += ["  " + line for line in yaml.safe_dump(config_to_dict(config), sort_keys=False)
            .splitlines()]
  lines += ["", "TF_CONFIG of each task:"]
  cluster = config.cluster
  if cluster.is_empty:
    lines.append("  (no cluster: one process, TF_CONFIG unset)")
  else:
    if not cluster.has_addresses:
      lines.append(f"  (tfdist launch gives each task {LOCALHOST} and a free port)")
      cluster = dataclasses.replace(cluster, addresses={
          job: tuple(f"{LOCALHOST}:<port>" for _ in range(cluster.count(job)))
          for job in cluster.jobs})
    for task in cluster.tasks():
      mark = "  <- this process" if task == config.task else ""
      lines.append(f"  {task}: {json.dumps(tf_config_for(cluster, task))}{mark}")
  replicas = replica_count(config, local_gpus)
  sizes = batch_sizes(config.training, replicas)
  lines += ["", f"strategy: {config.strategy.name}, replicas in sync: {replicas}"
            f" ({local_gpus} GPU(s) per machine)",
            f"batch: global {_or_unset(sizes.global_batch_size)}, per replica "
            f"{_or_unset(sizes.per_replica_batch_size)}"]
  if policy is not None:
    lines.append(f"precision: mixed_precision {config.training.mixed_precision} is {policy} "
                 "on this machine")
  return "\n".join(lines)


def _policy(config: Config) -> str:
  from tfdist.config import rules
  from tfdist.training.precision import policy_for
  return policy_for(config.training.mixed_precision,
                    loss_scaling=config.strategy.name not in rules.NO_LOSS_SCALING)


def _or_unset(value):
  return "unset" if value is None else value


def _gpus_if_needed(config: Config) -> int:
  options = config.strategy.options
  if config.strategy.name in ("default", "one_device") or getattr(options, "devices", ()) or \
      getattr(options, "compute_devices", ()):
    return 0
  from tfdist.strategy.devices import local_gpu_count
  return local_gpu_count()
