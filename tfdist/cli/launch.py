"""`tfdist launch CONFIG [--task TYPE:INDEX] [--dry-run] [--max-restarts N] -- COMMAND...`:
every task of the config's cluster on this machine (a cluster given by counts: 127.0.0.1 and
free ports), or one task of a real cluster on this host, supervised."""

from __future__ import annotations

import sys
import time

from absl import flags

from tfdist.config import load_config
from tfdist.config.loader import parse_task_flag

USAGE = "tfdist launch CONFIG [--task TYPE:INDEX] [--dry-run] [--max-restarts N] -- COMMAND"
FLAGS = flags.FLAGS


def run(args: list[str], task: str | None) -> int:
  from tfdist.launch import plan, ports, supervisor

  if not args:
    raise SystemExit(f"usage: {USAGE}")
  config_path, command = args[0], args[1:]
  config = load_config(config_path, environ={})  # The file alone: the launcher sets TF_CONFIG.
  only = parse_task_flag(task, config.source) if task else None
  log_dir = FLAGS.logs or f"tfdist-logs/{time.strftime('%Y%m%d-%H%M%S')}"
  tasks = 1 if only else len(config.cluster.tasks())

  def make_plan():
    return plan.plan_launch(
        config, config_path, command, log_dir=log_dir, task=only,
        ports=() if config.cluster.has_addresses else ports.free_ports(tasks))

  first = make_plan()  # Plans (and so checks) before anything starts.
  for address in plan.public_addresses(config):
    print(f"tfdist launch: warning: {address} is a public address; TensorFlow's gRPC servers "
          "have no authentication: run the cluster on a trusted, private network",
          file=sys.stderr)
  if FLAGS["dry-run"].value:
    print(first.describe())
    return 0
  plans = iter([first])
  outcome = supervisor.Supervisor(
      lambda: next(plans, None) or make_plan(), startup_timeout=FLAGS["startup-timeout"].value,
      max_restarts=FLAGS["max-restarts"].value, grace_period=FLAGS["grace-period"].value).run()
  print(f"tfdist launch: {outcome.message} (exit code {outcome.code}); logs in {log_dir}",
        file=sys.stderr)
  return outcome.code
