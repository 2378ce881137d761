"""`tfdist launch CONFIG [FLAGS] -- COMMAND`: every task of the config's cluster on this machine
(a cluster given by counts: 127.0.0.1 and free ports, held until the launch ends), one task of a
real cluster on this host (`--task`, `--slurm`), or one process for a config without a cluster;
supervised: output prefixed per task and logged, tasks ended with the launcher, the root cause
of a failure named."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

from absl import flags

from tfdist.config import load_config
from tfdist.config.loader import parse_task_flag

USAGE = ("tfdist launch CONFIG [--task TYPE:INDEX | --slurm] [--dry-run] [--fresh] "
         "[--max-restarts N] [--startup-timeout S] [--heartbeat-timeout S] [--grace-period S] "
         "[--logs DIR] [--verbose] [--keep-alive] [--tensorboard] [--port P] -- COMMAND")
FLAGS = flags.FLAGS


def run(args: list[str], task: str | None) -> int:
  from tfdist.launch import gpus, plan, ports, supervisor
  from tfdist.machine import facts

  if not args:
    raise SystemExit(f"usage: {USAGE}")
  config_path, command = args[0], args[1:]
  config = load_config(config_path, environ={})  # The file alone: the launcher sets TF_CONFIG.
  only = parse_task_flag(task, config.source) if task else None
  local_task = None  # This task's place among the host's GPU tasks, when not the only one.
  if FLAGS.slurm:
    from tfdist.export.slurm import cluster_from_slurm
    config = cluster_from_slurm(config, FLAGS.port)
    only = config.task
    local_task = gpus.slurm_local_task(os.environ)
  host_gpus = facts.visible_gpus()
  log_dir = FLAGS.logs or f"tfdist-logs/{time.strftime('%Y%m%d-%H%M%S')}"
  held = []  # The ports of the running plan, held until it ends.

  def make_plan(fresh: bool = False):
    while held:
      held.pop().close()
    if not config.cluster.has_addresses:
      held.append(ports.HeldPorts(len(config.cluster.tasks())))
    return plan.plan_launch(config, config_path, command, log_dir=log_dir, task=only,
                            ports=held[0].ports if held else (), fresh=fresh, gpus=host_gpus,
                            local_task=local_task)

  stack = contextlib.ExitStack()
  try:
    # Plans (and so checks) before anything starts. Only the first start is fresh: a restart
    # resumes from the backup this run wrote.
    first = make_plan(fresh=FLAGS.fresh)
    for address in plan.public_addresses(config):
      print(f"tfdist launch: warning: {address} is a public address; TensorFlow's gRPC servers "
            "have no authentication: run the cluster on a trusted, private network",
            file=sys.stderr)
    if FLAGS["dry-run"].value:
      print(first.describe())
      return 0
    if FLAGS.tensorboard:
      stack.callback(_start_tensorboard(config))  # Stopped with the launch.
    events = None
    if config.tensorboard.log_dir:  # The launcher's lines beside the run's curves.
      from tfdist.monitoring.launch_events import LaunchEvents
      events = LaunchEvents(os.path.join(config.tensorboard.log_dir, plan.run_name(log_dir),
                                         "launcher"))
      stack.callback(events.close)
    plans = iter([first])
    outcome = supervisor.Supervisor(
        lambda: next(plans, None) or make_plan(), startup_timeout=FLAGS["startup-timeout"].value,
        max_restarts=FLAGS["max-restarts"].value, grace_period=FLAGS["grace-period"].value,
        heartbeat_timeout=FLAGS["heartbeat-timeout"].value, verbose=FLAGS.verbose,
        on_say=events).run()
  finally:
    stack.close()
    while held:
      held.pop().close()
  if FLAGS.slurm and outcome.code == supervisor.TASK_FAILED:
    from tfdist.export.slurm import record_exit
    record_exit(outcome.root_cause_code or outcome.code)
  with contextlib.suppress(BrokenPipeError, OSError):  # A reader that went away (`| head`).
    print(f"tfdist launch: {outcome.message}; exit code {outcome.code}; logs in {log_dir}",
          file=sys.stderr, flush=True)
  if outcome.code == supervisor.OK and FLAGS["keep-alive"].value:
    _wait_until_stopped()
  return outcome.code


def _start_tensorboard(config):
  """Starts TensorBoard on the config's log directory; returns its stop function."""
  from tfdist.cli.tensorboard import required_log_dir
  from tfdist.monitoring.server import start_tensorboard

  log_dir = required_log_dir(config, "for --tensorboard")
  url, stop = start_tensorboard(log_dir)
  print(f"tfdist launch: TensorBoard on {log_dir} at {url}", file=sys.stderr, flush=True)
  return stop


def _wait_until_stopped() -> None:
  from tfdist.launch.supervisor import STOP_SIGNALS

  stop = set(STOP_SIGNALS)
  signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # Before saying so: a stop may come at once.
  with contextlib.suppress(BrokenPipeError, OSError):
    print("tfdist launch: --keep-alive: staying up until stopped", file=sys.stderr, flush=True)
  signal.sigwait(stop)
