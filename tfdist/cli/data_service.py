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
  from tfdist.data_service import own_address, run_data_service_server
  address = own_address(config)  # A task of another job is refused before TensorFlow loads.
  import_tensorflow_without_keras()
  print(f"tfdist data-service: {config.task} of {config.source or 'TF_CONFIG'} at {address}",
        flush=True)
  run_data_service_server(config)
  return 0
