"""`tfdist env [CONFIG] [--json]`: this machine's facts for a bug report (versions, TensorFlow
build, devices, CPU features, what `auto` picks, free ports); with a config of a local cluster,
the same from a process per task, with what differs between tasks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from absl import app, flags

from tfdist.cli import flags as cli_flags
from tfdist.config.schema import TaskConfig

FLAGS_DECLARED = (cli_flags.Flag("json", "bool", False, "Print the facts as one JSON object."),)
USAGE = cli_flags.usage("env", "[CONFIG]", FLAGS_DECLARED)
FLAGS = flags.FLAGS


def run(args: list[str], task: TaskConfig | None) -> int:
  from tfdist.monitoring import environment

  del task
  if len(args) > 1:
    raise app.UsageError(f"usage: {USAGE}")
  if not args:
    facts = environment.gather()
    print(json.dumps(facts) if FLAGS.json else environment.render(facts))
    return 0
  reports = _every_task(args[0])
  different = environment.differences(reports)
  if FLAGS.json:
    print(json.dumps({"tasks": reports, "differences": different}))
    return 0
  for name, facts in reports.items():
    print(f"== {name}\n{environment.render(facts)}\n")
  if len(reports) > 1:
    print("\n".join(different) if different else f"the {len(reports)} tasks agree")
  return 0


def _every_task(config_path: str) -> dict[str, dict]:
  """`tfdist env --json` in a process per task of the config's cluster, each with its own
  TF_CONFIG (a cluster given by counts: on this machine); a config without a cluster is this
  process."""
  from tfdist.config import load_config
  from tfdist.config.tf_config import tf_config_json, with_local_addresses
  from tfdist.errors import ConfigError
  from tfdist.machine.ports import free_ports

  from tfdist.monitoring import environment

  config = load_config(config_path, environ={})
  cluster = config.cluster
  if cluster.is_empty:  # One process on this machine: this one.
    return {"local": environment.gather()}
  if cluster.has_addresses:
    raise ConfigError("must be a cluster given by counts (a cluster on this machine); on a real "
                      "cluster run `tfdist env` on each host", key="cluster",
                      received=cluster.counts(), source=config.source)
  cluster = with_local_addresses(cluster, free_ports(len(cluster.tasks())))
  processes = {t.name: subprocess.Popen(
      [sys.executable, "-m", "tfdist", "env", "--json"], stdout=subprocess.PIPE,
      env={**os.environ, "TF_CONFIG": tf_config_json(cluster, t), "TF_CPP_MIN_LOG_LEVEL": "3"})
      for t in cluster.tasks()}
  reports = {}
  for name, process in processes.items():
    out, _ = process.communicate(timeout=120)
    reports[name] = json.loads(out.decode().strip().splitlines()[-1])
  return reports
