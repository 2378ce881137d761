"""`tfdist model-export MODEL OUT_DIR`: a `.keras` file as a SavedModel for TensorFlow Serving,
reloaded and checked equal, with the batching parameters file `--enable_batching` reads
(`--max-batch-size`, `--max-wait-ms`, as `tfdist model-server` batches)."""

from __future__ import annotations

import pathlib

from absl import app, flags

from tfdist.cli import flags as cli_flags
from tfdist.config.schema import TaskConfig

FLAGS_DECLARED = (cli_flags.MAX_BATCH_SIZE, cli_flags.MAX_WAIT_MS)
USAGE = cli_flags.usage("model-export", "MODEL OUT_DIR", FLAGS_DECLARED)
FLAGS = flags.FLAGS


def run(args: list[str], task: TaskConfig | None) -> int:
  del task
  if len(args) != 2:
    raise app.UsageError(f"usage: {USAGE}")
  from tfdist.cli.models import require_model
  model, _ = require_model(args[0])  # Before TensorFlow is imported: one line on stderr.
  from tfdist.serving.saved_model import export_for_serving
  saved = export_for_serving(model, args[1], max_batch_size=FLAGS["max-batch-size"].value,
                             max_wait_ms=FLAGS["max-wait-ms"].value)
  print(f"tfdist model-export: wrote {saved} (reloaded, equal) and "
        f"{pathlib.Path(args[1]) / 'batching_parameters.txt'}")
  return 0
