"""Slurm: the sbatch script of a config, and each srun task's cluster and task.

Slurm starts one process per task (`srun`); TensorFlow's `SlurmClusterResolver` turns Slurm's
environment (SLURM_PROCID, SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE) into the cluster:
tasks are packed node by node, ports counted up from `port` on each node, and the ranks handed
to the jobs in alphabetical order (chief, evaluator, ps, worker).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from typing import Sequence

from tfdist.config.schema import Config, TaskConfig
from tfdist.errors import ConfigError
from tfdist.launch.plan import require_command


def sbatch_script(config: Config, config_path: str, command: Sequence[str], *, job_name: str,
                  nodes: int | None = None, port: int = 2222, gpus_per_task: int = 0) -> str:
  """The sbatch script that runs every task of `config` as one srun task.

  Args:
    config: the validated config; its cluster gives the task counts.
    config_path: the config file, as the compute nodes see it.
    command: the user's training command.
    job_name: Slurm's job name (also names the output file).
    nodes: nodes to spread the tasks over; None puts each task on a node of its own.
    port: the first port of the tasks on each node.
    gpus_per_task: GPUs Slurm binds to each task (0: none requested).

  Raises:
    ConfigError: the cluster is empty, or `nodes` is out of range.
  """
  tasks = len(config.cluster.tasks())
  if not tasks:
    raise ConfigError("must name the tasks to run (e.g. cluster: {worker: 2})", key="cluster",
                      received={}, source=config.source)
  nodes = tasks if nodes is None else nodes
  if not 1 <= nodes <= tasks:
    raise ConfigError(f"must be from 1 to the cluster's {tasks} task(s)", key="--nodes",
                      received=nodes)
  require_command(command, "tfdist export slurm")
  roles = ", ".join(f"{n} {job}" for job, n in sorted(config.cluster.counts().items()))
  lines = [
      "#!/bin/bash",
      f"# Made by `tfdist export slurm`: {roles}, one srun task each. Submit with `sbatch`.",
      f"#SBATCH --job-name={job_name}",
      f"#SBATCH --ntasks={tasks}",
      f"#SBATCH --nodes={nodes}",
      f"#SBATCH --output={job_name}-%j.out",
  ]
  if gpus_per_task:
    lines.append(f"#SBATCH --gpus-per-task={gpus_per_task}")
  launch = ["python", "-m", "tfdist", "launch", os.path.abspath(config_path), "--slurm",
            "--port", str(port), "--", *command]
  lines += [
      "set -euo pipefail",
      "# Each task takes its role and its peers' addresses from Slurm's environment.",
      "srun --kill-on-bad-exit=1 " + shlex.join(launch),
  ]
  return "\n".join(lines) + "\n"


def cluster_from_slurm(config: Config, port: int = 2222) -> Config:
  """`config` with the addresses and the task of this srun task, from Slurm's environment.

  Raises:
    ConfigError: not inside an srun step, or the step has a different number of tasks than
      the config's cluster.
  """
  import tensorflow as tf

  tasks = len(config.cluster.tasks())
  try:
    # GPUs are Slurm's to bind (--gpus-per-task); the GPU arguments only keep the resolver's
    # arithmetic whole (it needs one "GPU" per task on a node).
    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(
        jobs=config.cluster.counts(), port_base=port, gpus_per_node=tasks, gpus_per_task=1,
        auto_set_gpu=False)
    spec = resolver.cluster_spec().as_dict()
  except (RuntimeError, ValueError) as e:
    raise ConfigError(f"needs the environment of an srun task of {tasks} task(s): {e}",
                      key="--slurm", received=os.environ.get("SLURM_PROCID", "no SLURM_PROCID"),
                      source=config.source) from None
  task_type, index = resolver.get_task_info()
  addresses = {job: tuple(spec[job]) for job in config.cluster.jobs}
  return dataclasses.replace(config,
                             cluster=dataclasses.replace(config.cluster, addresses=addresses),
                             task=TaskConfig(task_type, index))
