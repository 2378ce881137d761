"""The local launch backend: every task of a cluster given by counts on this machine (127.0.0.1
and free ports), the one task `--task` names of a real cluster, or one process for a config
without a cluster; processes started as this host's children."""

from __future__ import annotations

import subprocess
from typing import Mapping

from tfdist.errors import ConfigError
from tfdist.machine import children
from tfdist.launch.backends import Discovery

NAME = "local"


def discover(config, options, environ: Mapping[str, str]) -> Discovery:
  """The config as it is, and `options.task` when it names one.

  Raises:
    ConfigError: `options.grpc_port` is given: a cluster by counts gets free ports, and a
      cluster by addresses has its own.
  """
  del environ
  if options.grpc_port is not None:
    raise ConfigError("a local launch takes free ports, or the ports of the cluster's "
                      "addresses; leave it out (it is for --backend slurm and export)",
                      key="--task-port", received=options.grpc_port)
  return Discovery(config, options.task)


def start(process) -> subprocess.Popen:
  """`process` (a `plan.ProcessPlan`) as a child in a session of its own (its group is stopped
  as one), output piped to the supervisor, the parent-death signal armed, signals unblocked."""
  return subprocess.Popen(process.argv, env=process.environ(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          start_new_session=True, preexec_fn=children.start_as_child)


def finish(outcome, environ: Mapping[str, str]) -> None:
  del outcome, environ
