"""`tfdist tensorboard LOG_DIR [--port P] [--bind-all]`: TensorBoard on a run's logs (or on the
`tensorboard.log_dir` of a config), bound to 127.0.0.1 unless `--bind-all`, until stopped."""

from __future__ import annotations

import os
import signal

from absl import app, flags

from tfdist.cli import flags as cli_flags
from tfdist.config.schema import TaskConfig


FLAGS_DECLARED = (
    cli_flags.PORT,
    cli_flags.Flag("bind-all", "bool", False, "Listen on every interface, not only 127.0.0.1."),
)
USAGE = cli_flags.usage("tensorboard", "LOG_DIR|CONFIG", FLAGS_DECLARED)
FLAGS = flags.FLAGS


def run(args: list[str], task: TaskConfig | None) -> int:
  from tfdist.monitoring.tensorboard_server import required_log_dir, start_tensorboard

  del task
  if len(args) != 1:
    raise app.UsageError(f"usage: {USAGE}")
  from tfdist.launch.supervisor import STOP_SIGNALS

  log_dir = args[0]
  if os.path.isfile(log_dir):  # A config: its tensorboard.log_dir.
    from tfdist.config import load_config
    log_dir = required_log_dir(load_config(log_dir, environ={}), "to show a run")
  stop = set(STOP_SIGNALS)
  signal.pthread_sigmask(signal.SIG_BLOCK, stop)
  url, shutdown = start_tensorboard(log_dir, port=FLAGS.port or 0,
                                    bind_all=FLAGS["bind-all"].value)
  print(f"tfdist tensorboard: {log_dir} at {url} (Ctrl-C stops it)", flush=True)
  signal.sigwait(stop)
  shutdown()
  return 0
