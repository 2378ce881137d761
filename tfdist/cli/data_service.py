"""`tfdist data-service [CONFIG] [--task dispatcher:0|data_worker:N]`: run the tf.data service's
dispatcher or a data worker of the config's cluster until stopped (`tfdist launch` runs it for
these roles)."""

from __future__ import annotations

from absl import app

from tfdist.cli import flags as cli_flags
from tfdist.cli.cluster_server import import_tensorflow_without_keras
from tfdist.config import load_config
from tfdist.config.schema import TaskConfig

FLAGS_DECLARED = (cli_flags.TASK,)
USAGE = cli_flags.usage("data-service", "[CONFIG]", FLAGS_DECLARED)


def run(args: list[str], task: TaskConfig | None) -> int:
  if len(args) > 1:
    raise app.UsageError(f"usage: {USAGE}")
  config = load_config(args[0] if args else None, task=task)
  from tfdist.data_service import run_data_service_server
  import_tensorflow_without_keras()
  server = config.task and config.cluster.addresses and \
      config.cluster.addresses.get(config.task.type, ())[config.task.index:][:1]
  print(f"tfdist data-service: {config.task} of {config.source or 'TF_CONFIG'}"
        f"{f' at {server[0]}' if server else ''}", flush=True)
  run_data_service_server(config)
  return 0
