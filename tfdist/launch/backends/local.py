"""The local launch backend: every task of a cluster given by counts on this machine (127.0.0.1
and free ports), the one task `--task` names of a real cluster, or one process for a config
without a cluster; processes started as this host's children."""

from __future__ import annotations

import subprocess
from typing import Mapping

from tfdist.config.loader import parse_task_flag
from tfdist.machine import children
from tfdist.launch.backends import Discovery

NAME = "local"


def discover(config, options, environ: Mapping[str, str]) -> Discovery:
  """The config as it is, and `options.task` (a TYPE:INDEX string) when it names one."""
  del environ
  task = parse_task_flag(options.task, config.source) if options.task else None
  return Discovery(config, task)


def start(process) -> subprocess.Popen:
  """`process` (a `plan.ProcessPlan`) as a child in a session of its own (its group is stopped
  as one), output piped to the supervisor, the parent-death signal armed, signals unblocked."""
  return subprocess.Popen(process.argv, env=process.environ(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          start_new_session=True, preexec_fn=children.start_as_child)


def finish(outcome, environ: Mapping[str, str]) -> None:
  del outcome, environ
