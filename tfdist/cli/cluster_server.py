"""`tfdist cluster-server [CONFIG] [--task TYPE:INDEX]`: run a worker or ps server of a
parameter-server cluster until stopped."""

from __future__ import annotations

from absl import app

from tfdist.cli import flags as cli_flags
from tfdist.config import load_config
from tfdist.config.schema import TaskConfig
from tfdist.strategy.cluster_server import run_cluster_server

FLAGS_DECLARED = (cli_flags.TASK,)
USAGE = cli_flags.usage("cluster-server", "[CONFIG]", FLAGS_DECLARED)


def run(args: list[str], task: TaskConfig | None) -> int:
  if len(args) > 1:
    raise app.UsageError(f"usage: {USAGE}")
  config = load_config(args[0] if args else None, task=task)
  if config.task is not None:  # Else the server says what is missing.
    print(f"tfdist cluster-server: {config.task} of {config.source or 'TF_CONFIG'}", flush=True)
  run_cluster_server(config)
  return 0
