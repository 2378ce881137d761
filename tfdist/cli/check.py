"""`tfdist check CONFIG [--task TYPE:INDEX]`: validate a config and show what it will do.

A bad config fails before TensorFlow is imported. TensorFlow is imported only to count this
machine's GPUs when the replica count depends on them and a GPU is visible, and to measure
`auto` precision's speed-up the first time on a machine (then cached).
"""

from __future__ import annotations

from absl import app

import dataclasses
import json

import yaml

from tfdist.config import (LOCALHOST, batch_sizes, config_to_dict, load_config, replica_count,
                           tf_config_for)
from tfdist.cli import flags as cli_flags
from tfdist.config.schema import Config, TaskConfig
from tfdist.errors import ConfigError

FLAGS_DECLARED = (cli_flags.TASK,)
USAGE = cli_flags.usage("check", "[CONFIG]", FLAGS_DECLARED)


def run(args: list[str], task: TaskConfig | None) -> int:
  if len(args) > 1:
    raise app.UsageError(f"usage: {USAGE}")
  config = load_config(args[0] if args else None, task=task)
  from tfdist.training import settings
  settings.refuse_unhonoured(config, settings.paths_of(config, settings.FIT))
  from tfdist.machine import facts
  host_gpus = facts.visible_gpus()
  gpus = _gpus_if_needed(config) if host_gpus else 0  # No GPU visible: TensorFlow stays out.
  if host_gpus:  # A task sees its share of the host's GPUs (CUDA_VISIBLE_DEVICES).
    gpus = min(gpus, max(len(s.devices) for s in _shares(config, host_gpus).values()))
  try:
    print(render(config, gpus, _policy(config), host_gpus=host_gpus))
  except ConfigError as e:  # The replica count's rules (batch.py) know no file: name it.
    raise e.from_source(config.source) from None
  return 0


def _shares(config: Config, host_gpus) -> dict:
  """Each task's GPUs as `tfdist launch` on this host gives them (one task of a real cluster
  runs on each host: the host's GPUs are its own)."""
  from tfdist.launch.gpus import host_shares, share_gpus
  if config.cluster.has_addresses:
    return {None: share_gpus(host_gpus, 0, 1, config.devices.gpus_per_task)}
  return host_shares(config, host_gpus)


def render(config: Config, local_gpus: int, policy=None, host_gpus=()) -> str:
  """The report `tfdist check` prints: normalised config, TF_CONFIG per task, batch sizes, and
  the dtype policy `training.mixed_precision` means on this machine (`policy`, a
  `machine.precision.Precision`)."""
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
  if host_gpus:
    lines.append(f"GPUs of each task on this host ({','.join(host_gpus)} visible): "
                 + gpu_shares(config, host_gpus))
  if policy is not None:
    lines.append(f"precision: mixed_precision {policy.mode} is "
                 f"{policy.describe()} on this machine")
  return "\n".join(lines)


def gpu_shares(config: Config, host_gpus) -> str:
  """Which GPUs each task `tfdist launch` starts here gets (CUDA_VISIBLE_DEVICES). Pure."""
  return "; ".join(f"{'each process' if t is None else t.name}: "
                   f"{','.join(s.devices) or 'none'}{' (shared)' if s.shared else ''}"
                   for t, s in _shares(config, host_gpus).items())


def _policy(config: Config):
  from tfdist.training import settings
  return settings.precision(config)


def _or_unset(value):
  return "unset" if value is None else value


def _gpus_if_needed(config: Config) -> int:
  from tfdist.config import strategies
  kind = strategies.kind(config.strategy.name)
  if kind.replicas == "one" or (kind.devices_option and
                                getattr(config.strategy.options, kind.devices_option)):
    return 0
  from tfdist.strategy.devices import local_gpu_count
  return local_gpu_count()
