"""`tfdist cluster-server [CONFIG] [--task TYPE:INDEX]`: run a worker or ps server of a
parameter-server cluster until stopped."""

from __future__ import annotations

import sys

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
  import_tensorflow_without_keras()
  if config.task is not None:  # Else the server says what is missing.
    print(f"tfdist cluster-server: {config.task} of {config.source or 'TF_CONFIG'}", flush=True)
  run_cluster_server(config)
  return 0


def import_tensorflow_without_keras() -> None:
  """Imports TensorFlow without the Keras its `__init__` loads eagerly (to register Keras's
  optimizers for SavedModel loading, b/196254385; Keras in turn imports scikit-learn and
  IPython where installed). A server runs the coordinator's graph functions and loads no model:
  its start measured 2.3-2.8 CPU-s instead of 4.3-4.8 (BUILD_NOTES.md). `import keras` later
  still works. `test_cli.py` says when TensorFlow stops loading Keras eagerly."""
  if "tensorflow" in sys.modules:
    return
  sys.modules["keras.src.optimizers"] = None  # TensorFlow's `except ImportError: pass` skips it.
  try:
    import tensorflow  # noqa: F401
  finally:
    del sys.modules["keras.src.optimizers"]
