"""Slurm: the sbatch script of a config. Each srun task it starts runs `tfdist launch
--backend slurm`, whose backend (`tfdist.launch.backends.slurm`) reads the task's cluster from
Slurm's environment and writes the root cause's exit code to `EXIT_FILE` for the script to
return.
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Sequence

from tfdist.config.schema import Config
from tfdist.errors import ConfigError
from tfdist.exit_codes import PREEMPTED
from tfdist.launch.backends.slurm import EXIT_FILE
from tfdist.launch.plan import require_command


def sbatch_script(config: Config, config_path: str, command: Sequence[str], *, job_name: str,
                  nodes: int | None = None, grpc_port: int | None = None, gpus_per_task: int = 0,
                  cpus_per_task: int = 1, notice: int = 90,
                  python: str = sys.executable) -> str:
  """The sbatch script that runs every task of `config` as one srun task.

  Args:
    config: the validated config; its cluster gives the task counts.
    config_path: the config file, as the compute nodes see it.
    command: the user's training command.
    job_name: Slurm's job name (also names the output file).
    nodes: nodes to spread the tasks over; None puts each task on a node of its own.
    grpc_port: the first port of the tasks' TensorFlow servers on each node; None gives
      each job its own.
    gpus_per_task: GPUs Slurm binds to each task (0: none requested).
    cpus_per_task: CPUs Slurm gives each task (sites binding tasks to CPUs give one otherwise).
    notice: seconds before the time limit at which Slurm sends the tasks the config's
      `checkpoint.preemption_signal` (`--signal`): they save their backups and exit with 42,
      and the script requeues the job, which resumes there (0: no notice). The job is
      requeueable (`--requeue`), so a preemption that requeues it resumes too.
    python: the interpreter the tasks run tfdist with.

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
  lines.append(f"#SBATCH --cpus-per-task={cpus_per_task}")
  lines.append("#SBATCH --requeue")
  lines.append("#SBATCH --open-mode=append")  # A requeued run adds to the output file.
  if notice:
    lines.append(f"#SBATCH --signal={config.checkpoint.preemption_signal[3:]}@{notice}")
  exit_file = EXIT_FILE.format(job="${SLURM_JOB_ID:-0}")
  # The interpreter that exported the script: a bare `python` may lack tfdist on a node's PATH.
  # The launcher gives a task most of the notice to save its backup before killing it.
  grace = max(notice - 10, 5) if notice else 25  # Slurm's KillWait: 30 s by default.
  launch = [python, "-m", "tfdist", "launch", os.path.abspath(config_path), "--backend", "slurm",
            *(["--task-port", str(grpc_port)] if grpc_port else []),
            "--grace-period", str(grace), "--", *command]
  lines += [
      "set -uo pipefail",
      "# Each task takes its role and its peers' addresses from Slurm's environment.",
      "srun --kill-on-bad-exit=1 " + shlex.join(launch),
      "status=$?",
      "# The root cause's exit code, not that of a peer srun stopped after it.",
      f'[ -f "{exit_file}" ] && status=$(cat "{exit_file}") && rm -f "{exit_file}"',
      f"# {PREEMPTED}: every task saved its backup after a notice; the requeued job resumes.",
      f'[ "$status" -eq {PREEMPTED} ] && scontrol requeue "$SLURM_JOB_ID" && exit 0',
      "exit $status",
  ]
  return "\n".join(lines) + "\n"
