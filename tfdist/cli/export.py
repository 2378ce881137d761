"""`tfdist export slurm|kubernetes CONFIG [FLAGS] -- COMMAND`: print the sbatch script or the
Kubernetes manifests that run the config's cluster on that engine (a model's SavedModel for
TensorFlow Serving is `tfdist model-export`)."""

from __future__ import annotations

import pathlib

from absl import app, flags

from tfdist.cli import flags as cli_flags
from tfdist.config import load_config
from tfdist.config.schema import TaskConfig
from tfdist.errors import ConfigError
from tfdist.job_files import kubernetes

FLAGS_DECLARED = (
    cli_flags.Flag("nodes", "integer", None, "slurm: nodes to spread the tasks over; default "
                   "one per task.", metavar="N", lower=1),
    cli_flags.TASK_PORT,
    cli_flags.Flag("gpus-per-task", "integer", 0, "slurm: GPUs Slurm binds to each task.",
                   metavar="G", lower=0),
    cli_flags.Flag("cpus-per-task", "integer", 1, "slurm: CPUs Slurm gives each task (sites "
                   "binding tasks to CPUs otherwise give each TensorFlow process one).",
                   metavar="C", lower=1),
    cli_flags.Flag("notice", "integer", 90, "slurm: seconds before the time limit at which "
                   "Slurm sends the tasks checkpoint.preemption_signal (--signal): they save "
                   "their backups, the job requeues itself and resumes (0: none).",
                   metavar="S", lower=0),
    cli_flags.Flag("image", "string", None, "kubernetes: the container image holding tfdist "
                   "and the training script (required).", metavar="IMAGE"),
    cli_flags.Flag("kind", "enum", kubernetes.KINDS[0], "kubernetes: a JobSet (jobset.x-k8s.io, what "
                   "Kubeflow Trainer v2 runs on: restarts the whole set after a failure or "
                   "preemption), a Kubeflow TFJob (training operator v1 only: Trainer v2 "
                   "dropped it), or plain StatefulSets and headless Services.",
                   choices=kubernetes.KINDS),
    cli_flags.Flag("name", "string", None, "The job's name; default the config file's name.",
                   metavar="NAME"),
    cli_flags.MAX_RESTARTS,
    cli_flags.Flag("namespace", "string", kubernetes.DEFAULT_NAMESPACE, "kubernetes: the "
                   "namespace.", metavar="NS"),
    cli_flags.Flag("volume-claim", "string", None, "kubernetes: a ReadWriteMany "
                   "PersistentVolumeClaim mounted where the config's checkpoint and TensorBoard "
                   "directories are (required when it has either).", metavar="PVC"),
)
OLD_SPELLINGS = {"port": "task-port", "grpc-port": "task-port"}
USAGE = cli_flags.usage("export", "slurm|kubernetes CONFIG", FLAGS_DECLARED, "-- COMMAND")
ENGINES = ("slurm", "kubernetes")
FLAGS = flags.FLAGS


def run(args: list[str], task: TaskConfig | None) -> int:
  from tfdist.job_files import slurm

  del task  # Every task is exported.
  if len(args) < 2:
    raise app.UsageError(f"usage: {USAGE}")
  engine, config_path, command = args[0], args[1], args[2:]
  if engine not in ENGINES:
    raise ConfigError(f"must be one of {', '.join(ENGINES)}", key="engine", received=engine)
  config = load_config(config_path, environ={})
  name = FLAGS.name or kubernetes.job_name(pathlib.Path(config_path).stem)
  if engine == "slurm":
    print(slurm.sbatch_script(config, config_path, command, job_name=name,
                              nodes=FLAGS.nodes, grpc_port=_grpc_port(),
                              gpus_per_task=FLAGS["gpus-per-task"].value,
                              cpus_per_task=FLAGS["cpus-per-task"].value,
                              notice=FLAGS.notice), end="")
  else:
    print(kubernetes.dump(kubernetes.manifests(
        config, command, name=name, image=FLAGS.image, namespace=FLAGS.namespace,
        grpc_port=_grpc_port() or kubernetes.DEFAULT_PORT, kind=FLAGS.kind,
        volume_claim=FLAGS["volume-claim"].value,
        max_restarts=FLAGS["max-restarts"].value)), end="")
  return 0



def _grpc_port() -> int | None:
  return cli_flags.renamed_value("export", "task-port", ("port", "grpc-port"))
