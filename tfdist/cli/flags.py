"""Every command-line flag of the `tfdist` CLI, defined in one place. Multi-word flags are
spelled with hyphens (`--dry-run`), as torchrun and accelerate spell theirs; read them as
`FLAGS["dry-run"].value`."""

import sys

from absl import flags

from tfdist.errors import ConfigError
from tfdist.launch import hangs  # The hang deadlines' defaults, said once.


COMMAND_FLAGS = {
    "launch": ("task", "backend", "slurm", "dry-run", "fresh", "max-restarts", "startup-timeout",
               "heartbeat-timeout", "hang-timeout", "epoch-end-timeout", "grace-period",
               "min-workers", "rendezvous-port", "logs",
               "verbose", "keep-alive", "tensorboard", "grpc-port", "port"),
    "check": ("task",),
    "tensorboard": ("port", "bind-all"),
    "env": ("json",),
    "estimate": ("model", "batch", "length", "generate", "memory"),
    "model-server": ("model-name", "name", "host", "port", "grpc-port", "max-batch-size",
                     "max-wait-ms", "max-queue", "max-body-bytes"),
    "cluster-server": ("task",),
    "export": ("nodes", "grpc-port", "port", "gpus-per-task", "cpus-per-task", "notice", "image",
               "kind", "name", "namespace", "volume-claim", "max-restarts"),
    "model-export": ("max-batch-size", "max-wait-ms"),
}
"""The flags each command reads, in the order its help lists them: a command given another's
flag refuses it (`tfdist.cli.main`)."""


def owners() -> dict[str, tuple[str, ...]]:
  """{flag name: the commands reading it}, for every flag `define_flags` defines."""
  found: dict[str, tuple[str, ...]] = {}
  for command, names in COMMAND_FLAGS.items():
    for name in names:
      found[name] = found.get(name, ()) + (command,)
  return found


_METAVARS = {"int": "N", "float": "SECONDS"}
_FLAG_METAVARS = {"max-wait-ms": "MS", "port": "PORT", "grpc-port": "PORT"}


def described(command: str) -> list[tuple[str, str, str]]:
  """(spelling, default, meaning) of each flag of `command` in its help's order: `--port N`,
  `--dry-run`; the default as the help writes it ("none" for None). What `--help` and the docs'
  CLI reference both show."""
  rows = []
  for name in COMMAND_FLAGS[command]:
    flag = flags.FLAGS[name]
    value = "" if flag.boolean else " " + _FLAG_METAVARS.get(
        name, _METAVARS.get(flag.parser.flag_type(), "VALUE"))
    default = "none" if flag.default is None else str(flag.default).lower()
    rows.append((f"--{name}{value}", default, flag.help))
  return rows


def grpc_port(command: str) -> int | None:
  """`--grpc-port`, or `--port` as its old spelling for launch and export, with a notice.

  Raises:
    ConfigError: both are given and differ.
  """
  return _renamed(command, "grpc-port", "port", " here")


def model_name() -> str | None:
  """`--model-name`, or `--name` as its old spelling for model-server, with a notice.

  Raises:
    ConfigError: both are given and differ.
  """
  return _renamed("model-server", "model-name", "name",
                  " (as TensorFlow Serving's --model_name)")


def _renamed(command: str, new_name: str, old_name: str, why: str):
  """`--NEW`'s value, or `--OLD`'s (its old spelling for `command`) after a one-line notice."""
  new, old = flags.FLAGS[new_name], flags.FLAGS[old_name]
  if not old.present:
    return new.value
  if new.present and new.value != old.value:
    raise ConfigError(f"must be given alone; --{old_name} {old.value} is its old spelling",
                      key=f"--{new_name}", received=new.value)
  print(f"tfdist {command}: --{old_name} is now spelled --{new_name}{why}; the old spelling "
        "goes in the next release", file=sys.stderr, flush=True)
  return old.value


def flags_help(command: str) -> str:
  """Every flag of `command`, one per line, with its default and meaning."""
  return "\n".join(f"  {spelling} (default: {default})\n      {meaning}"
                   for spelling, default, meaning in described(command))


def define_flags() -> None:
  """Defines the CLI's flags; call once, before parsing."""
  flags.DEFINE_string(
      "task", None, "The task this process runs, as TYPE:INDEX (e.g. worker:1). Overrides the "
      "config file's task and TF_CONFIG's.")
  flags.DEFINE_bool("dry-run", False, "launch: print the plan of processes; start nothing.")
  flags.DEFINE_integer("max-restarts", 0, "launch: restarts allowed after a failure (of the "
                       "whole synchronous cluster, or of a failed parameter-server worker); "
                       "export kubernetes --kind jobset: the JobSet's failurePolicy.maxRestarts "
                       "(a preemption's restart is not counted).", lower_bound=0)
  flags.DEFINE_integer("notice", 90, "export slurm: seconds before the time limit at which "
                       "Slurm sends the tasks checkpoint.preemption_signal (--signal): they "
                       "save their backups, the job requeues itself and resumes (0: none).",
                       lower_bound=0)
  flags.DEFINE_float("startup-timeout", 120, "launch: seconds for every task's server to come "
                     "up before the launch fails naming the missing tasks.", lower_bound=1)
  flags.DEFINE_float("heartbeat-timeout", 60, "launch: seconds a task may go without a "
                     "heartbeat (frozen: stopped, swapped out) before it is named as the root "
                     "cause and the launch fails.", lower_bound=1)
  flags.DEFINE_float("hang-timeout", None, "launch: seconds no task's training may progress "
                     "(outside an epoch's end) before the task the others wait for is named, "
                     "every task's stack written to its log and the cluster stopped (restarted "
                     f"within --max-restarts); default {hangs.HANG_DEFAULT}, armed after every "
                     "task's first call.", lower_bound=1)
  flags.DEFINE_float("epoch-end-timeout", None, "launch: the same at an epoch's end (its "
                     "on_epoch_end callbacks, checkpoints): slow is fine, "
                     f"forever is not; default {hangs.EPOCH_END_DEFAULT}.", lower_bound=1)
  flags.DEFINE_integer("min-workers", None, "launch: an elastic cluster (torchrun's --nnodes "
                       "MIN:MAX): a worker that fails with no restarts left (--max-restarts) is "
                       "dropped, and the others go on from the backup with the same global "
                       "batch, while at least this many workers remain; default: the launch "
                       "ends. Local launches (per-host ones with --rendezvous-port) and Ray's; "
                       "synchronous training.", lower_bound=1)
  flags.DEFINE_integer("rendezvous-port", None, "launch: per-host elastic launches (--task, "
                       "--min-workers): the port on the chief's host where the chief's launcher "
                       "keeps the members (torchrun's c10d rendezvous); the same on every host. "
                       "A worker whose launcher stops or goes silent is dropped; started again, "
                       "it is taken in as an epoch begins.", lower_bound=1, upper_bound=65535)
  flags.DEFINE_float("grace-period", 25, "launch: seconds between SIGTERM and SIGKILL when "
                     "stopping tasks (a preempted task saves its backup meanwhile); default 25, "
                     "inside Kubernetes' and Slurm's default 30.", lower_bound=0)
  flags.DEFINE_string("logs", None, "launch: directory of the per-task logs; default "
                      "tfdist-logs/<date-time>.")
  flags.DEFINE_bool("verbose", False, "launch: show every task's output; by default the "
                    "terminal shows the chief's (every task's goes to its log).")
  flags.DEFINE_bool("fresh", False, "launch: start training over, ignoring the backup of an "
                    "earlier run (restarts within this launch still resume).")
  flags.DEFINE_bool("tensorboard", False, "launch: start TensorBoard on the config's "
                    "tensorboard.log_dir beside the cluster (127.0.0.1) and print its URL.")
  flags.DEFINE_bool("json", False, "env: print the facts as one JSON object.")
  flags.DEFINE_string("model", None, "estimate: the function building the model, as "
                      "module:function (the module imported from the current directory).")
  flags.DEFINE_integer("batch", None, "estimate: the global batch; default the config's (with "
                       "--generate: the prompts generated at once, default 1).", lower_bound=1)
  flags.DEFINE_integer("length", None, "estimate: training: the length each input dimension "
                       "the model leaves open counts at (a sequence's); needed when it leaves "
                       "one open.", lower_bound=1)
  flags.DEFINE_integer("generate", None, "estimate: plan generation, not training, of sequences "
                       "this many tokens long, prompt included (a KerasHub causal LM): weights, "
                       "key/value cache and working memory per device.", lower_bound=1)
  flags.DEFINE_string("memory", None, "estimate: each device's memory, as 16GiB, 512MiB or bytes "
                      "(plan for the devices you will run on); default: this machine's (a "
                      "GPU's memory limit or size, the RAM for CPUs).")
  flags.DEFINE_bool("bind-all", False, "tensorboard: listen on every interface, not only "
                    "127.0.0.1.")
  flags.DEFINE_enum("backend", "local", ["local", "slurm", "ray"], "launch: where the tasks "
                    "run: local (this machine, or --task's role of a real cluster), slurm (the "
                    "cluster and this task from an srun step's environment; see `tfdist export "
                    "slurm`), ray (each task a Ray actor of the cluster RAY_ADDRESS names).")
  flags.DEFINE_bool("slurm", False, "launch: the old spelling of --backend slurm.")
  flags.DEFINE_bool("keep-alive", False, "launch: after a successful end, stay up until "
                    "stopped (for engines that restart exited containers, like StatefulSets).")
  flags.DEFINE_integer("port", None, "tensorboard, model-server: the port it serves HTTP on "
                       "(default: a free one). launch, export: the old spelling of --grpc-port "
                       "(a notice; gone in the next release).", lower_bound=1,
                       upper_bound=65535)
  flags.DEFINE_integer("grpc-port", None, "model-server: the port it serves gRPC on "
                       "(TensorFlow Serving's PredictionService, KServe V2's "
                       "GRPCInferenceService; default: a free one; TensorFlow Serving's is "
                       "8500). launch --backend slurm, export slurm|kubernetes: the "
                       "port the tasks' TensorFlow servers listen on. Kubernetes: every pod's "
                       "(default 2222). Slurm: the first on each node, tasks sharing a node "
                       "counting up from it (default: one of the job's own, from its job id, so "
                       "jobs sharing a node do not collide). A local launch picks free ports "
                       "or takes the config's addresses, and Ray's its actors' nodes, so they "
                       "refuse it.", lower_bound=1, upper_bound=65535)
  flags.DEFINE_integer("cpus-per-task", 1, "export slurm: CPUs Slurm gives each task (sites "
                       "binding tasks to CPUs otherwise give each TensorFlow process one).",
                       lower_bound=1)
  flags.DEFINE_integer("nodes", None, "export slurm: nodes to spread the tasks over; default "
                       "one per task.", lower_bound=1)
  flags.DEFINE_integer("gpus-per-task", 0, "export slurm: GPUs Slurm binds to each task.",
                       lower_bound=0)
  flags.DEFINE_string("image", None, "export kubernetes: the container image holding tfdist "
                      "and the training script.")
  flags.DEFINE_enum("kind", "jobset", ["jobset", "tfjob", "statefulset"], "export kubernetes: "
                    "a JobSet (jobset.x-k8s.io, what Kubeflow Trainer v2 runs on: restarts "
                    "the whole set after a failure or preemption), a Kubeflow TFJob (training "
                    "operator v1 only: Trainer v2 dropped it), or plain StatefulSets and "
                    "headless Services.")
  flags.DEFINE_string("name", None, "export: the job's name; default the config file's name. "
                      "model-server: the old spelling of --model-name (a notice; gone in the "
                      "next release).")
  flags.DEFINE_string("model-name", None, "model-server: the model's name in its URLs "
                      "(/v1/models/NAME), as TensorFlow Serving's --model_name (required).")
  flags.DEFINE_string("host", "127.0.0.1", "model-server: the address HTTP and gRPC listen "
                      "on.")
  flags.DEFINE_integer("max-batch-size", 32, "model-server, model-export: rows per batch at "
                       "most.", lower_bound=1)
  flags.DEFINE_float("max-wait-ms", 2.0, "model-server, model-export: how long a batch may "
                     "wait for more requests.", lower_bound=0)
  flags.DEFINE_integer("max-queue", 1024, "model-server: requests waiting at most; beyond it "
                       "429 (gRPC: RESOURCE_EXHAUSTED). A request larger than a batch takes one "
                       "place and is answered whole.", lower_bound=1)
  flags.DEFINE_integer("max-body-bytes", 64 << 20, "model-server: the largest request body or "
                       "gRPC message; beyond it 413 (gRPC: RESOURCE_EXHAUSTED).", lower_bound=1)
  flags.DEFINE_string("namespace", "default", "export kubernetes: the namespace.")
  flags.DEFINE_string("volume-claim", None, "export kubernetes: a ReadWriteMany "
                      "PersistentVolumeClaim mounted where the config's checkpoint and "
                      "TensorBoard directories are (required when it has either).")
