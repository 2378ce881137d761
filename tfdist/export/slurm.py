"""Slurm: the sbatch script of a config, and each srun task's cluster and task.

Slurm starts one process per task (`srun`). tfdist reads the step's nodes and tasks per node
from Slurm's environment in Slurm's own order (TensorFlow's `SlurmClusterResolver` sorts host
names as text, so `node[9-10]` gave rank 0 on node9 the address of node10): ranks are packed
node by node (block distribution), ports counted up from the job's port on each node, and the
ranks handed to the jobs in the order chief, evaluator, ps, worker.

Each job gets its own ports unless `--port` says otherwise (two jobs sharing a node both on
2222 fail: "Could not start gRPC server"); the job's exit code is its root cause's, which the
first failing task writes to `tfdist-<job id>.exit` for the batch script to return.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shlex
import sys
from typing import Mapping, Sequence

from tfdist.config.schema import Config, TaskConfig
from tfdist.exit_codes import PREEMPTED
from tfdist.errors import ConfigError
from tfdist.launch.plan import require_command

EXIT_FILE = "tfdist-{job}.exit"
_STEP_VARIABLES = ("SLURM_PROCID", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")


def sbatch_script(config: Config, config_path: str, command: Sequence[str], *, job_name: str,
                  nodes: int | None = None, port: int | None = None, gpus_per_task: int = 0,
                  cpus_per_task: int = 1, notice: int = 90,
                  python: str = sys.executable) -> str:
  """The sbatch script that runs every task of `config` as one srun task.

  Args:
    config: the validated config; its cluster gives the task counts.
    config_path: the config file, as the compute nodes see it.
    command: the user's training command.
    job_name: Slurm's job name (also names the output file).
    nodes: nodes to spread the tasks over; None puts each task on a node of its own.
    port: the first port of the tasks on each node; None gives each job its own.
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
  grace = max(notice - 10, 5) if notice else 5
  launch = [python, "-m", "tfdist", "launch", os.path.abspath(config_path), "--slurm",
            *(["--port", str(port)] if port else []), "--grace-period", str(grace), "--",
            *command]
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


def expand_hostlist(text: str) -> list[str]:
  """Slurm's compressed host list (`node[9-10],gpu[098-101]`) as host names, in Slurm's order
  (the order of its ranks), zero padding kept. Pure.

  ```python
  expand_hostlist("node[9-10],login1")   # ["node9", "node10", "login1"]
  ```
  """
  hosts = []
  for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text):
    match = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", item)
    if not match:
      hosts.append(item)
      continue
    prefix, ranges, rest = match.groups()
    for part in ranges.split(","):
      first, _, last = part.partition("-")
      for number in range(int(first), int(last or first) + 1):
        hosts += [f"{prefix}{number:0{len(first)}d}{tail}" for tail in expand_hostlist(rest)
                  or [""]]
  return hosts


def tasks_per_node(text: str) -> list[int]:
  """Slurm's tasks-per-node list (`2(x3),1`) as one count per node. Pure."""
  counts = []
  for item in text.split(","):
    match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
    if not match:
      raise ValueError(f"not a Slurm tasks-per-node list: {text!r}")
    counts += [int(match.group(1))] * int(match.group(2) or 1)
  return counts


def job_port(job_id: str | None, base: int = 20000, stride: int = 16, room: int = 40000) -> int:
  """The first port of a Slurm job's tasks on each node: distinct for jobs sharing a node, with
  room for `stride` tasks a node. Pure."""
  return base + (int(job_id or 0) * stride) % room


def slurm_cluster(counts: dict[str, int], environ: Mapping[str, str], port: int):
  """(addresses by job, this rank's task) from an srun task's environment. Pure.

  Raises:
    ValueError: a variable is missing or the step has another number of tasks.
  """
  missing = [v for v in _STEP_VARIABLES if v not in environ]
  if missing:
    raise ValueError(f"{missing[0]} not found in environment")
  hosts = expand_hostlist(environ["SLURM_STEP_NODELIST"])
  per_node = tasks_per_node(environ["SLURM_STEP_TASKS_PER_NODE"])
  if len(per_node) != len(hosts):
    raise ValueError(f"{len(hosts)} node(s) but tasks per node for {len(per_node)}")
  ranks = [f"{host}:{port + local}" for host, n in zip(hosts, per_node) for local in range(n)]
  wanted = sum(counts.values())
  if len(ranks) != wanted:
    raise ValueError(f"Requested {wanted} tasks but only {len(ranks)} were assigned")
  addresses, tasks, first = {}, [], 0
  for job in sorted(counts):  # chief, evaluator, ps, worker: the order ranks are handed out.
    addresses[job] = tuple(ranks[first:first + counts[job]])
    tasks += [TaskConfig(job, i) for i in range(counts[job])]
    first += counts[job]
  return addresses, tasks[int(environ["SLURM_PROCID"])]


def cluster_from_slurm(config: Config, port: int | None = None,
                       environ: Mapping[str, str] = os.environ) -> Config:
  """`config` with the addresses and the task of this srun task, from Slurm's environment.

  Args:
    config: the validated config; its cluster gives the task counts.
    port: the first port on each node; None takes the job's own (`job_port`).
    environ: the srun task's environment.

  Raises:
    ConfigError: not inside an srun step, or the step has a different number of tasks than
      the config's cluster.
  """
  tasks = len(config.cluster.tasks())
  port = port or job_port(environ.get("SLURM_JOB_ID"))
  try:
    addresses, task = slurm_cluster(config.cluster.counts(), environ, port)
  except (ValueError, IndexError) as e:
    raise ConfigError(f"needs the environment of an srun task of {tasks} task(s): {e}",
                      key="--slurm", received=environ.get("SLURM_PROCID", "no SLURM_PROCID"),
                      source=config.source) from None
  return dataclasses.replace(config,
                             cluster=dataclasses.replace(config.cluster, addresses=addresses),
                             task=task)


def record_exit(code: int, environ: Mapping[str, str] = os.environ) -> None:
  """Writes the job's exit code for the batch script, unless a task that failed first did
  (`O_EXCL`: the first writer wins)."""
  path = EXIT_FILE.format(job=environ.get("SLURM_JOB_ID", "0"))
  with contextlib.suppress(FileExistsError):
    fd = os.open(os.path.join(environ.get("SLURM_SUBMIT_DIR", "."), path),
                 os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    with os.fdopen(fd, "w") as f:
      f.write(f"{code}\n")
