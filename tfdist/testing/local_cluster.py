"""Real clusters on this machine for tests and benchmarks: one process per task on 127.0.0.1,
each with its own TF_CONFIG, bounded in time and killed by process id.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Iterator, Mapping, Sequence

from tfdist.config.loader import CONFIG_ENV
from tfdist.config.schema import ClusterConfig, TaskConfig
from tfdist.config.tf_config import tf_config_json, with_local_addresses
from tfdist.machine.ports import HeldPorts, free_ports
from tfdist.testing import forked


def local_cluster(cluster: ClusterConfig) -> ClusterConfig:
  """The cluster with a free loopback port for each task."""
  return with_local_addresses(cluster, free_ports(len(cluster.tasks())))


@dataclasses.dataclass
class TaskProcess:
  """A running task: its process, and the file its output goes to."""
  task: TaskConfig
  process: subprocess.Popen  # Or a `preload.ForkedTask`, its like.
  log: pathlib.Path

  def output(self) -> str:
    return self.log.read_text(errors="replace")


def start_task(task: TaskConfig, argv: Sequence[str], cluster: ClusterConfig,
               log_dir: os.PathLike, *, config_path: os.PathLike | None = None,
               env: Mapping[str, str] | None = None) -> TaskProcess:
  """Starts `argv` as `task` of `cluster`, in a session of its own, output to a log file
  (forked from a test suite's preloaded TensorFlow where it may be: `forked.popen`)."""
  environ = {**os.environ, **(env or {}), "TF_CONFIG": tf_config_json(cluster, task),
             "TF_CPP_MIN_LOG_LEVEL": "2"}
  if config_path is not None:
    environ[CONFIG_ENV] = os.fspath(config_path)
  log = pathlib.Path(log_dir) / f"{task.name}.log"
  with open(log, "wb") as out:
    process = forked.popen(argv, environ, stdout=out.fileno())
  return TaskProcess(task, process, log)


def kill(processes: Sequence[TaskProcess]) -> None:
  """Kills each process's session with SIGKILL (multi-worker TensorFlow ignores SIGTERM)."""
  for p in processes:
    if p.process.poll() is None:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(p.process.pid, signal.SIGKILL)
  for p in processes:
    p.process.wait()


def wait(processes: Sequence[TaskProcess], timeout: float) -> None:
  """Waits for every process to exit; on timeout kills them all and raises TimeoutError."""
  deadline = time.monotonic() + timeout
  for p in processes:
    try:
      p.process.wait(timeout=max(deadline - time.monotonic(), 0.01))
    except subprocess.TimeoutExpired:
      kill(processes)
      raise TimeoutError(f"{p.task} did not finish in {timeout} s; its log:\n"
                         f"{p.output()[-3000:]}") from None


@contextlib.contextmanager
def running(processes: list[TaskProcess]) -> Iterator[list[TaskProcess]]:
  """Yields `processes` and kills whatever of them still runs on the way out."""
  try:
    yield processes
  finally:
    kill(processes)


def python_argv(*args: str) -> list[str]:
  return [sys.executable, *args]


def run_everywhere(config_path: os.PathLike, argv: Sequence[str], log_dir: os.PathLike,
                   timeout: float, env: Mapping[str, str] | None = None) -> list[TaskProcess]:
  """Runs `argv` as every task of the config's cluster (given by counts) on free loopback
  ports (held until the run ends: `HeldPorts`), waits for all of them, and returns the
  finished processes."""
  from tfdist.config.loader import load_config

  cluster = load_config(config_path, environ={}).cluster
  with HeldPorts(len(cluster.tasks())) as held:  # Until the run ends: its servers bind them.
    cluster = with_local_addresses(cluster, held.ports)
    processes = [start_task(task, argv, cluster, log_dir, config_path=config_path, env=env)
                 for task in cluster.tasks()]
    with running(processes):
      wait(processes, timeout)
  return processes
