"""`tfdist export slurm|kubernetes CONFIG [FLAGS] -- COMMAND`: print the sbatch script or the
Kubernetes manifests that run the config's cluster on that engine. `tfdist export serving MODEL
OUT_DIR`: a SavedModel for TensorFlow Serving with its batching parameters."""

from __future__ import annotations

import pathlib

from absl import flags

from tfdist.config import load_config
from tfdist.errors import ConfigError

USAGE = ("tfdist export slurm CONFIG [--nodes N] [--port P] [--gpus-per-task G] "
         "[--cpus-per-task C] [--notice S] -- COMMAND | "
         "tfdist export kubernetes CONFIG --image IMAGE [--kind jobset|tfjob|statefulset] "
         "[--name N] [--max-restarts N] "
         "[--namespace NS] [--port P] [--volume-claim PVC] -- COMMAND | "
         "tfdist export serving MODEL OUT_DIR [--max-batch-size N] [--max-wait-ms MS]")
ENGINES = ("slurm", "kubernetes", "serving")
FLAGS = flags.FLAGS


def run(args: list[str], task: str | None) -> int:
  from tfdist.job_files import kubernetes, slurm

  del task  # Every task is exported.
  if len(args) < 2:
    raise SystemExit(f"usage: {USAGE}")
  engine, config_path, command = args[0], args[1], args[2:]
  if engine not in ENGINES:
    raise ConfigError(f"must be one of {', '.join(ENGINES)}", key="engine", received=engine)
  if engine == "serving":
    return _serving(args[1:])
  config = load_config(config_path, environ={})
  name = FLAGS.name or kubernetes.job_name(pathlib.Path(config_path).stem)
  if engine == "slurm":
    print(slurm.sbatch_script(config, config_path, command, job_name=name,
                              nodes=FLAGS.nodes, port=FLAGS.port,
                              gpus_per_task=FLAGS["gpus-per-task"].value,
                              cpus_per_task=FLAGS["cpus-per-task"].value,
                              notice=FLAGS.notice), end="")
  else:
    print(kubernetes.dump(kubernetes.manifests(
        config, command, name=name, image=FLAGS.image, namespace=FLAGS.namespace,
        port=FLAGS.port or kubernetes.DEFAULT_PORT, kind=FLAGS.kind,
        volume_claim=FLAGS["volume-claim"].value,
        max_restarts=FLAGS["max-restarts"].value)), end="")
  return 0


def _serving(args: list[str]) -> int:
  if len(args) != 2:
    raise SystemExit(f"usage: {USAGE}")
  from tfdist.cli.models import require_model
  model, _ = require_model(args[0])  # Before TensorFlow is imported: one line on stderr.
  from tfdist.serving.saved_model import export_for_serving
  saved = export_for_serving(model, args[1], max_batch_size=FLAGS["max-batch-size"].value,
                             max_wait_ms=FLAGS["max-wait-ms"].value)
  print(f"tfdist export serving: wrote {saved} (reloaded, equal) and "
        f"{pathlib.Path(args[1]) / 'batching_parameters.txt'}")
  return 0
