"""A launch as data: which processes, with which command, environment and log file.

Pure: the config, the user's command, the ports and paths are arguments; nothing is started.
`tfdist launch --dry-run` prints the plan; the supervisor starts it.
"""

from __future__ import annotations

import collections
import dataclasses
import ipaddress
import json
import os
import time
import sys
from typing import Sequence

from tfdist.config import strategies
from tfdist.config.loader import (CONFIG_ENV, DATA_SERVICE_ENV, FRESH_ENV, MEMBERS_OF_ENV,
                                  PREPARE_ENV, RUN_ENV)
from tfdist.config.roles import is_chief
from tfdist.config.schema import DATA_SERVICE_JOBS, Config, TaskConfig
from tfdist.config.tf_config import split_address, tf_config_json, with_local_addresses
from tfdist.errors import ConfigError
from tfdist.launch.gpus import host_shares
from tfdist.launch.liveness import HEARTBEAT_ENV


@dataclasses.dataclass(frozen=True)
class ProcessPlan:
  """One process of a launch.

  Attributes:
    task: the task it runs; None for the one process of a config without a cluster.
    argv: its command.
    env: the variables it gets on top of the launcher's environment.
    log: its log file.
    serves: True for a parameter-server cluster's worker and ps servers, which never exit by
      themselves; False for the processes running the user's command.
    address: the host:port its TensorFlow server listens on; None for an evaluator (it serves
      nothing).
    chief: the task whose output the terminal shows by default (the chief, or worker 0).
  """
  task: TaskConfig | None
  argv: tuple[str, ...]
  env: tuple[tuple[str, str], ...]
  log: str
  serves: bool
  address: str | None
  chief: bool = False

  @property
  def name(self) -> str:
    return "local" if self.task is None else self.task.name

  def environ(self) -> dict[str, str]:
    """The environment it runs in: this process's, then the plan's (TensorFlow's C++ log
    level 2 unless the user set one)."""
    return {"TF_CPP_MIN_LOG_LEVEL": "2", **os.environ, **dict(self.env)}


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
  """Every process of a launch and how a failure is handled.

  Attributes:
    processes: the processes, in start order (servers first).
    restart_scope: "cluster" (synchronous training restarts as a whole) or "task"
      (parameter-server training restarts a failed worker alone).
    peers: (name, host:port) of every task of the cluster that serves, this host's and the
      others': the start-up deadline waits for each of them.
    advice: lines the launcher says before it starts (a better layout for this host).
  """
  processes: tuple[ProcessPlan, ...]
  restart_scope: str
  peers: tuple[tuple[str, str], ...] = ()
  advice: tuple[str, ...] = ()

  def describe(self, commands: bool = True) -> str:
    """The plan as `--dry-run` and `--verbose` print it: each task's address and log, then,
    with `commands`, its command and environment (TF_CONFIG); the advice last. Without them
    the terminal says one line per task as it starts (`processes.start`)."""
    lines = [f"tfdist launch: {len(self.processes)} process(es), restart scope: "
             f"{self.restart_scope}"]
    for p in self.processes if commands else ():
      lines.append(f"  {p.name:<12} {p.address or '(no server)':<22} log {p.log}")
      lines.append(f"  {'':<12} $ {' '.join(p.argv)}")
      lines += [f"  {'':<12}   {key}={value}" for key, value in p.env]
    return "\n".join(lines + list(self.advice))


def without_workers(config: Config, lost: Sequence[str]) -> Config:
  """`config` with its cluster less the `lost` workers (by name, "worker-2"), the others
  renumbered from 0 (TF_CONFIG's indices are positions), its batch re-derived. Pure.

  Raises:
    ConfigError: the global batch does not divide over the replicas left, or a lost task is
      not one of its workers.
  """
  from tfdist.config import rules
  from tfdist.config.batch import batch_sizes, replica_count
  if not lost:
    return config
  cluster = config.cluster
  gone = sorted(int(name.rsplit("-", 1)[1]) for name in lost)
  if any(not name.startswith("worker-") for name in lost) or gone[-1] >= cluster.worker:
    raise ConfigError(f"must name workers of the cluster (worker-0 to "
                      f"worker-{cluster.worker - 1})", key="lost workers", received=list(lost))
  addresses = None
  if cluster.has_addresses:
    addresses = {**cluster.addresses, "worker": tuple(
        a for i, a in enumerate(cluster.addresses["worker"]) if i not in gone)}
  shrunk = dataclasses.replace(config, cluster=dataclasses.replace(
      cluster, worker=cluster.worker - len(gone), addresses=addresses))
  rules.check(shrunk)
  batch_sizes(shrunk.training, replica_count(shrunk))  # Refused if it no longer divides.
  return shrunk


def renumbered(task: TaskConfig | None, workers: Sequence[str],
               lost: Sequence[str]) -> TaskConfig | None:
  """`task` (named as the config names it) among the `workers` left without `lost` (TF_CONFIG's
  indices are positions). Pure.

  ```python
  renumbered(TaskConfig("worker", 2), ["worker-0", "worker-1", "worker-2"], ["worker-1"])
  # TaskConfig(type="worker", index=1)
  ```
  """
  if task is None or task.type != "worker" or not lost:
    return task
  return TaskConfig("worker", [w for w in workers if w not in lost].index(task.name))


def plan_launch(config: Config, config_path: str, command: Sequence[str], *, log_dir: str,
                ports: Sequence[int] = (), task: TaskConfig | None = None,
                python: str = sys.executable, fresh: bool = False, gpus: Sequence[str] = (),
                local_task: tuple[int, int] | None = None,
                members_of: str | None = None) -> LaunchPlan:
  """Plans the processes of `config`'s cluster on this host.

  Args:
    config: the validated config, as loaded from `config_path`.
    config_path: the config file, passed on to every process (`TFDIST_CONFIG`).
    command: the user's training command, run by the chief, the workers of a synchronous
      cluster and the evaluator.
    log_dir: where each process's log goes (`<type>-<index>.log`).
    ports: one free port per task, for a cluster given by counts (a local cluster).
    task: run only this task (one role on this host of a real cluster); None runs them all.
    python: the interpreter that runs `tfdist cluster-server` for parameter-server servers.
    fresh: training starts over instead of resuming from its backup (`TFDIST_FRESH=1`).
    gpus: this host's visible GPUs (`machine.facts.visible_gpus`): each task gets its share
      (`launch.gpus.share_gpus`) as `CUDA_VISIBLE_DEVICES`.
    local_task: with `task`, its (index, count) among the GPU tasks of this host (Slurm's
      local id); default (0, 1): the host's GPUs are all its own.
    members_of: the user's config file when `config_path` is the launcher's copy of it with
      the current members (`MEMBERS_OF_ENV`: a script's `load_config` of it reads the copy).

  Raises:
    ConfigError: there is no command, a local cluster without ports, or `task` on a cluster
      given by counts.
  """
  cluster = config.cluster
  require_command(command, "tfdist launch")
  config_path, log_dir = os.path.abspath(config_path), os.path.abspath(log_dir)
  members = ((MEMBERS_OF_ENV, os.path.abspath(members_of)),) if members_of else ()
  if cluster.is_empty:  # One process on this machine: the same command for every config.
    env = ((CONFIG_ENV, config_path), (HEARTBEAT_ENV, heartbeat_path(log_dir, "local"))) + \
        _user_command_env(fresh, log_dir) + \
        host_shares(config, gpus)[None].env(gpus, config.devices.gpu_memory)
    return LaunchPlan((ProcessPlan(None, tuple(command), env, os.path.join(log_dir, "local.log"),
                                   False, None, True),), "cluster")
  if not cluster.has_addresses:
    if task is not None:
      raise ConfigError("names a task of a real cluster: give the cluster's addresses "
                        "(worker: [\"host:port\", ...]), not counts", key="--task",
                        received=str(task), source=config.source)
    cluster = with_local_addresses(cluster, ports)
  processes = []
  shares = host_shares(config, gpus, task=task, local_task=local_task)
  served = data_service_env(cluster)
  for t in shares:
    serves = runs_server(config, t.type)
    command_of = "data-service" if t.type in DATA_SERVICE_JOBS else "cluster-server"
    argv = ((python, "-m", "tfdist", command_of, config_path, "--task", f"{t.type}:{t.index}")
            if serves else tuple(command))
    env = (("TF_CONFIG", tf_config_json(cluster, t)), (CONFIG_ENV, config_path), *members,
           (HEARTBEAT_ENV, heartbeat_path(log_dir, t.name)), *served)
    env += shares[t].env(gpus, config.devices.gpu_memory)
    if not serves:
      env += _user_command_env(fresh, log_dir)
    address = None if t.type == "evaluator" else cluster.addresses[t.type][t.index]
    processes.append(ProcessPlan(t, argv, env, os.path.join(log_dir, f"{t.name}.log"),
                                 serves, address, is_chief(dataclasses.replace(config, task=t))))
  processes.sort(key=lambda p: not p.serves)  # Servers first: the chief connects to them.
  asynchronous = strategies.kind(config.strategy.name).asynchronous
  peers = tuple((t.name, cluster.addresses[t.type][t.index])
                for t in cluster.tasks() if t.type != "evaluator")
  return LaunchPlan(tuple(processes), "task" if asynchronous else "cluster", peers,
                    host_advice(config, [p for p in processes if not p.serves], gpus))


def data_service_env(cluster) -> tuple[tuple[str, str], ...]:
  """`DATA_SERVICE_ENV` for every task of a cluster with tf.data service roles (their
  addresses, which TF_CONFIG leaves out); () without. Pure."""
  if not cluster.dispatcher or cluster.addresses is None:
    return ()
  return ((DATA_SERVICE_ENV, json.dumps({job: list(cluster.addresses[job])
                                         for job in DATA_SERVICE_JOBS})),)


def host_advice(config: Config, trainers: Sequence[ProcessPlan], gpus: Sequence[str]) -> tuple:
  """A line for synchronous workers sharing this host's CPUs: their all-reduce goes through
  gRPC between processes, and one worker with every core was measured faster (issue 25). Pure.
  """
  hosts = collections.Counter(split_address(p.address)[0] for p in trainers if p.address)
  sharing = max(hosts.values(), default=0)  # The most workers on one host (Ray: any node).
  if not strategies.kind(config.strategy.name).all_reduces_across_workers or gpus or \
      sharing < 2:
    return ()
  return (f"advice: {sharing} workers share one host's CPU cores; on CPUs one worker "
          "per host using all of them trains faster (workers on one host all-reduce through "
          "gRPC; measured by benchmarks/bench_scaling.py, BUILD_NOTES.md). Several workers on "
          "one host are for trying a cluster's code paths.",)


def heartbeat_path(log_dir: str, name: str) -> str:
  """The file task `name` touches every second (`tfdist.launch.liveness`)."""
  return os.path.join(log_dir, f".{name}.heartbeat")


SCRIPT_HOOK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "script_hook")
"""The folder whose `sitecustomize` imports tfdist in a launched script that does not."""


def _user_command_env(fresh: bool, log_dir: str) -> tuple[tuple[str, str], ...]:
  """What the processes running the user's command get besides TF_CONFIG and the config:
  `import tfdist` there makes the strategy before the script runs (a script that never
  imports it gets it from `SCRIPT_HOOK`, first on its PYTHONPATH), TensorBoard's run is named
  after the launch's log directory, and `fresh` starts over."""
  path = os.pathsep.join(p for p in (SCRIPT_HOOK, os.environ.get("PYTHONPATH")) if p)
  return ((PREPARE_ENV, "1"), (RUN_ENV, run_name(log_dir)), ("PYTHONPATH", path)) + \
      (((FRESH_ENV, "1"),) if fresh else ())


def new_run_name(environ, now: float, token: str) -> str:
  """The name of a new launch's run, unique per job: Slurm's job id (the same across a
  requeue, so the requeued job resumes its own backup), a Kubernetes job's (`TFDIST_JOB_ID`,
  set by the exported manifests from the Job's name), else the local time `now` and a random
  `token` (two launches in one second differ). Pure.

  >>> new_run_name({"SLURM_JOB_ID": "1041"}, 0, "a1b2c3")
  'slurm-1041'
  """
  if environ.get("TFDIST_JOB_ID"):
    return environ["TFDIST_JOB_ID"]
  if environ.get("SLURM_JOB_ID"):
    return f"slurm-{environ['SLURM_JOB_ID']}"
  return f"{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}-{token}"


def run_name(log_dir: str) -> str:
  """The run a launch's TensorBoard files go under (`<tensorboard.log_dir>/<run>`): the name of
  its log directory."""
  return os.path.basename(os.path.abspath(log_dir))


def require_command(command: Sequence[str], cli: str) -> None:
  """Raises ConfigError when the user's training command (after `--`) of `cli` is missing."""
  if not command:
    raise ConfigError(f"must be given after --, e.g. {cli} CONFIG -- python train.py",
                      key="command", received="nothing")


def runs_server(config: Config, job: str) -> bool:
  """True for the tasks that run a server of tfdist's instead of the user's command: the
  workers and ps of a parameter-server cluster (`tfdist cluster-server`), the tf.data service's
  roles (`tfdist data-service`)."""
  return job in DATA_SERVICE_JOBS or (
      strategies.kind(config.strategy.name).asynchronous and job in ("worker", "ps"))


def public_addresses(config: Config) -> list[str]:
  """The config's addresses outside loopback and private ranges (TensorFlow's gRPC servers have
  no authentication: such a cluster is open to whoever can reach it)."""
  found = []
  for addresses in (config.cluster.addresses or {}).values():
    for address in addresses:
      host, _ = split_address(address)
      try:
        ip = ipaddress.ip_address(host.strip("[]"))
      except ValueError:
        continue  # A host name: its address is not known here.
      if not (ip.is_private or ip.is_loopback or ip.is_link_local):
        found.append(address)
  return found
