"""The local launch backend: every task of a cluster given by counts on this machine (127.0.0.1
and free ports), the one task `--task` names of a real cluster, or one process for a config
without a cluster; processes started as this host's children, Python ones forked from one that
imported TensorFlow once (`--preload`, `machine.preload`)."""

from __future__ import annotations

import subprocess
import sys
from typing import Mapping

from tfdist.errors import ConfigError
from tfdist.machine import children, facts, preload
from tfdist.launch.backends import Discovery

NAME = "local"


def discover(config, options, environ: Mapping[str, str]) -> Discovery:
  """The config as it is, `options.task` when it names one, and the preloaded fork server
  when `options.preload` asks (None: on a host without GPUs).

  Raises:
    ConfigError: `options.grpc_port` is given: a cluster by counts gets free ports, and a
      cluster by addresses has its own.
  """
  if options.grpc_port is not None:
    raise ConfigError("a local launch takes free ports, or the ports of the cluster's "
                      "addresses; leave it out (it is for --backend slurm and export)",
                      key="--task-port", received=options.grpc_port)
  preloads = options.preload
  if preloads is None:  # Forking from a CUDA build's import is not yet measured on a GPU.
    preloads = not facts.visible_gpus(environ)
  return Discovery(config, options.task,
                   starter=Preloaded(asked=bool(options.preload)) if preloads else None)


class Preloaded:
  """Starts each task forked from a server that imported TensorFlow and Keras once, where its
  command allows (`preload.Preloaded.start`), else as `start` does; the server ends with the
  launch. `asked` (`--preload on`): the first task that cannot be forked is said, once."""

  def __init__(self, asked: bool = False):
    self._server = preload.Preloaded()
    self._unsaid = asked

  def start(self, process) -> subprocess.Popen:
    forked = self._server.start(process.argv, process.environ())
    if forked is None and self._unsaid:
      self._unsaid = False
      print(f"tfdist launch: --preload on: {process.name} starts as its own process: its "
            f"command is not `python SCRIPT` or `python -m MODULE` run by {sys.executable} "
            "(a shim or another interpreter, interpreter options), or its environment "
            f"differs from the first task's beyond {', '.join(preload.PER_TASK)} and "
            "TFDIST_*", file=sys.stderr, flush=True)
    return forked or start(process)

  def close(self) -> None:
    self._server.close()


def start(process) -> subprocess.Popen:
  """`process` (a `plan.ProcessPlan`) as a child in a session of its own (its group is stopped
  as one), output piped to the supervisor, the parent-death signal armed, signals unblocked."""
  return subprocess.Popen(process.argv, env=process.environ(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          start_new_session=True, preexec_fn=children.start_as_child)


def finish(outcome, environ: Mapping[str, str]) -> None:
  del outcome, environ
