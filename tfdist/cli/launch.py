"""`tfdist launch CONFIG [FLAGS] -- COMMAND`: every task of the config's cluster on this machine
(a cluster given by counts: 127.0.0.1 and free ports, held until the launch ends), one task of a
real cluster on this host (`--task`, `--backend slurm`), every task as a Ray actor
(`--backend ray`), or one process for a config without a cluster;
supervised: output prefixed per task and logged, tasks ended with the launcher, the root cause
of a failure named."""

from __future__ import annotations

import contextlib
import signal
import sys

from absl import app, flags

from tfdist.cli import flags as cli_flags
from tfdist.config.schema import TaskConfig
from tfdist.launch import backends, hangs

FLAGS_DECLARED = (
    cli_flags.TASK,
    cli_flags.Flag("backend", "enum", "local", "Where the tasks run: local (this machine, or "
                   "--task's role of a real cluster), slurm (the cluster and this task from an "
                   "srun step's environment; see `tfdist export slurm`), ray (each task a Ray "
                   "actor of the cluster RAY_ADDRESS names).", choices=backends.NAMES),
    cli_flags.Flag("dry-run", "bool", False, "Print the plan of processes; start nothing."),
    cli_flags.Flag("fresh", "bool", False, "Start training over, ignoring the backup of an "
                   "earlier run (restarts within this launch still resume)."),
    cli_flags.MAX_RESTARTS,
    cli_flags.Flag("max-restarts-per-task", "integer", None, "The restarts one task's failures "
                   "may cause, within --max-restarts (a flapping host does not spend the "
                   "cluster's budget; torchrun counts each agent's): a task failing past it is "
                   "dropped (--min-workers) or ends the launch; default: only --max-restarts "
                   "counts.", metavar="N", lower=0),
    cli_flags.Flag("startup-timeout", "float", 120, "Seconds for every task's server to come up "
                   "before the launch fails naming the missing tasks.", metavar="S", lower=1),
    cli_flags.Flag("heartbeat-timeout", "float", 60, "Seconds a task may go without a heartbeat "
                   "(frozen: stopped, swapped out) before it is named as the root cause and the "
                   "launch fails.", metavar="S", lower=1),
    cli_flags.Flag("hang-timeout", "float", None, "Seconds no task's training may progress "
                   "(outside an epoch's end) before the task the others wait for is named, "
                   "every task's stack written to its log and the cluster stopped (restarted "
                   f"within --max-restarts); default {hangs.HANG_DEFAULT}, armed after every "
                   "task's first call.", metavar="S", lower=1),
    cli_flags.Flag("epoch-end-timeout", "float", None, "The same at an epoch's end (its "
                   "on_epoch_end callbacks, checkpoints): slow is fine, forever is not; default "
                   f"{hangs.EPOCH_END_DEFAULT}.", metavar="S", lower=1),
    cli_flags.Flag("grace-period", "float", 25, "Seconds between SIGTERM and SIGKILL when "
                   "stopping tasks (a preempted task saves its backup meanwhile); default 25, "
                   "inside Kubernetes' and Slurm's default 30.", metavar="S", lower=0),
    cli_flags.Flag("min-workers", "integer", None, "An elastic cluster (torchrun's --nnodes "
                   "MIN:MAX): a worker that fails with no restarts left (--max-restarts) is "
                   "dropped, and the others go on from the backup with the same global batch, "
                   "while at least this many workers remain; default: the launch ends. Local "
                   "launches (per-host ones with --rendezvous-port) and Ray's; synchronous "
                   "training.", metavar="N", lower=1),
    cli_flags.Flag("rendezvous-port", "integer", None, "Per-host elastic launches (--task, "
                   "--min-workers): the port on the chief's host where the chief's launcher "
                   "keeps the members (torchrun's c10d rendezvous); the same on every host. A "
                   "worker whose launcher stops or goes silent is dropped; started again, it is "
                   "taken in as an epoch begins.", metavar="PORT", lower=1, upper=65535),
    cli_flags.Flag("trust-network", "bool", False, "Per-host elastic launches: let the "
                   "rendezvous go without TFDIST_RENDEZVOUS_SECRET, hearing any caller that "
                   "reaches its port (a network that is the job's alone, as TensorFlow's own "
                   "gRPC servers assume); without it a launch with no secret is refused."),
    cli_flags.Flag("logs", "string", None, "Directory of the per-task logs; default "
                   "tfdist-logs/<date-time>.", metavar="DIR"),
    cli_flags.Flag("verbose", "bool", False, "Show every task's output; by default the terminal "
                   "shows the chief's (every task's goes to its log)."),
    cli_flags.Flag("keep-alive", "bool", False, "After a successful end, stay up until stopped "
                   "(for engines that restart exited containers, like StatefulSets)."),
    cli_flags.Flag("tensorboard", "bool", False, "Start TensorBoard on the config's "
                   "tensorboard.log_dir beside the cluster (127.0.0.1) and print its URL."),
    cli_flags.Flag("preload", "enum", "auto", "on: start each task's Python program (python "
                   "SCRIPT, python -m MODULE) forked from one process that imported TensorFlow "
                   "and Keras once (a start or restart costs ~0.1 CPU-s instead of ~6); off: "
                   "each its own interpreter; auto (default): on where this host has no GPU "
                   "(forking has not been measured on one). Local backend only.",
                   choices=("auto", "on", "off")),
    cli_flags.TASK_PORT,
    cli_flags.Flag("slurm", "bool", False, "The old spelling of --backend slurm (a notice; gone "
                   "in the next release)."),
)
OLD_SPELLINGS = {"port": "task-port", "grpc-port": "task-port"}
USAGE = cli_flags.usage("launch", "CONFIG", FLAGS_DECLARED, "-- COMMAND")
FLAGS = flags.FLAGS


def run(args: list[str], task: TaskConfig | None) -> int:
  from tfdist.launch.launcher import LaunchOptions, dry_run, launch
  from tfdist.exit_codes import OK

  if not args:
    raise app.UsageError(f"usage: {USAGE}")
  options = LaunchOptions(
      task=task, backend=_backend(), fresh=FLAGS.fresh,
      grpc_port=cli_flags.renamed_value("launch", "task-port", ("port", "grpc-port")),
      max_restarts=FLAGS["max-restarts"].value,
      max_restarts_per_task=FLAGS["max-restarts-per-task"].value,
      startup_timeout=FLAGS["startup-timeout"].value,
      heartbeat_timeout=FLAGS["heartbeat-timeout"].value,
      hang_timeout=FLAGS["hang-timeout"].value,
      epoch_end_timeout=FLAGS["epoch-end-timeout"].value,
      grace_period=FLAGS["grace-period"].value, min_workers=FLAGS["min-workers"].value,
      rendezvous_port=FLAGS["rendezvous-port"].value,
      trust_network=FLAGS["trust-network"].value, logs=FLAGS.logs, verbose=FLAGS.verbose,
      tensorboard=FLAGS.tensorboard,
      preload={"auto": None, "on": True, "off": False}[FLAGS.preload])
  if FLAGS["dry-run"].value:
    print(dry_run(args[0], args[1:], options).describe())
    return OK
  outcome = launch(args[0], args[1:], options)
  if outcome.code == OK and FLAGS["keep-alive"].value:
    _wait_until_stopped()
  return outcome.code


def _backend() -> str:
  """`--backend`; `--slurm` is kept as a spelling of `--backend slurm`, with a notice."""
  if not FLAGS.slurm:
    return FLAGS.backend
  if FLAGS["backend"].present and FLAGS.backend != "slurm":
    raise app.UsageError(f"--slurm and --backend {FLAGS.backend} disagree; give --backend "
                         "alone")
  print("tfdist launch: --slurm is now spelled --backend slurm", file=sys.stderr, flush=True)
  return "slurm"


def _wait_until_stopped() -> None:
  from tfdist.launch.supervisor import STOP_SIGNALS

  stop = set(STOP_SIGNALS)
  signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # Before saying so: a stop may come at once.
  with contextlib.suppress(BrokenPipeError, OSError):
    print("tfdist launch: --keep-alive: staying up until stopped", file=sys.stderr, flush=True)
  signal.sigwait(stop)
