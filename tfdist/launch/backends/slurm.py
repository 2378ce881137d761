"""The Slurm launch backend: each srun task's cluster and task from Slurm's environment, and
the job's exit code for the batch script (`tfdist launch --backend slurm`).

Slurm starts one process per task (`srun`). tfdist reads the step's nodes and tasks per node
from Slurm's environment in Slurm's own order (TensorFlow's `SlurmClusterResolver` sorts host
names as text, so `node[9-10]` gave rank 0 on node9 the address of node10): ranks are packed
node by node (block distribution), ports counted up from the job's port on each node, and the
ranks handed to the jobs in the order chief, evaluator, ps, worker.

Each job gets its own ports unless `--task-port` says otherwise (two jobs sharing a node both on
2222 fail: "Could not start gRPC server"); the job's exit code is its root cause's, which the
first failing task writes to `tfdist-<job id>.exit` for the batch script to return.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from typing import Mapping

from tfdist.config.schema import Config, TaskConfig
from tfdist.errors import ConfigError
from tfdist.launch import gpus
from tfdist.launch.backends import Discovery, local

NAME = "slurm"
EXIT_FILE = "tfdist-{job}.exit"
_STEP_VARIABLES = ("SLURM_PROCID", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")
start = local.start  # Slurm started this process; its task runs as a local child.


def discover(config: Config, options, environ: Mapping[str, str]) -> Discovery:
  """This srun task's cluster (addresses from Slurm's nodes) and task, and its place among the
  host's GPU tasks (`SLURM_LOCALID`)."""
  if options.task is not None:
    raise ConfigError("Slurm gives each srun task its role; leave --task out", key="--task",
                      received=str(options.task))
  config = cluster_from_slurm(config, options.grpc_port, environ)
  return Discovery(config, config.task, gpus.slurm_local_task(environ))


def finish(outcome, environ: Mapping[str, str] = os.environ) -> None:
  """Writes a failed launch's root cause's exit code, or a preempted one's, for the batch
  script: `srun --kill-on-bad-exit` stops a task's peers once it exits 42 after its save, and
  a peer stopped so (143) must not turn the job's preemption into a failure."""
  from tfdist.exit_codes import PREEMPTED, TASK_FAILED
  if outcome.code == TASK_FAILED:
    record_exit(outcome.root_cause_code or outcome.code, environ)
  elif outcome.code == PREEMPTED:
    record_exit(PREEMPTED, environ)


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


def slurm_cluster(counts: dict[str, int], environ: Mapping[str, str], grpc_port: int):
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
  ranks = [f"{host}:{grpc_port + local}"
           for host, n in zip(hosts, per_node) for local in range(n)]
  wanted = sum(counts.values())
  if len(ranks) != wanted:
    raise ValueError(f"Requested {wanted} tasks but only {len(ranks)} were assigned")
  addresses, tasks, first = {}, [], 0
  for job in sorted(counts):  # chief, evaluator, ps, worker: the order ranks are handed out.
    addresses[job] = tuple(ranks[first:first + counts[job]])
    tasks += [TaskConfig(job, i) for i in range(counts[job])]
    first += counts[job]
  return addresses, tasks[int(environ["SLURM_PROCID"])]


def cluster_from_slurm(config: Config, grpc_port: int | None = None,
                       environ: Mapping[str, str] = os.environ) -> Config:
  """`config` with the addresses and the task of this srun task, from Slurm's environment.

  Args:
    config: the validated config; its cluster gives the task counts.
    grpc_port: the first port of the tasks' servers on each node; None takes the job's own
      (`job_port`).
    environ: the srun task's environment.

  Raises:
    ConfigError: not inside an srun step, or the step has a different number of tasks than
      the config's cluster.
  """
  tasks = len(config.cluster.tasks())
  grpc_port = grpc_port or job_port(environ.get("SLURM_JOB_ID"))
  try:
    addresses, task = slurm_cluster(config.cluster.counts(), environ, grpc_port)
  except (ValueError, IndexError) as e:
    raise ConfigError(f"needs the environment of an srun task of {tasks} task(s): {e}",
                      key="--backend slurm",
                      received=environ.get("SLURM_PROCID", "no SLURM_PROCID"),
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
