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

from tfdist.config.schema import TaskConfig

USAGE = ("tfdist launch CONFIG [--task TYPE:INDEX] [--backend local|slurm|ray] [--dry-run] "
         "[--fresh] "
         "[--max-restarts N] [--startup-timeout S] [--heartbeat-timeout S] [--hang-timeout S] "
         "[--epoch-end-timeout S] "
         "[--grace-period S] [--min-workers N] [--rendezvous-port P] [--logs DIR] [--verbose] [--keep-alive] [--tensorboard] "
         "[--grpc-port P] -- COMMAND")
FLAGS = flags.FLAGS


def run(args: list[str], task: TaskConfig | None) -> int:
  from tfdist.cli.flags import grpc_port
  from tfdist.launch.launcher import LaunchOptions, dry_run, launch
  from tfdist.exit_codes import OK

  if not args:
    raise app.UsageError(f"usage: {USAGE}")
  options = LaunchOptions(
      task=task, backend=_backend(), grpc_port=grpc_port("launch"), fresh=FLAGS.fresh,
      max_restarts=FLAGS["max-restarts"].value, startup_timeout=FLAGS["startup-timeout"].value,
      heartbeat_timeout=FLAGS["heartbeat-timeout"].value,
      hang_timeout=FLAGS["hang-timeout"].value,
      epoch_end_timeout=FLAGS["epoch-end-timeout"].value,
      grace_period=FLAGS["grace-period"].value, min_workers=FLAGS["min-workers"].value,
      rendezvous_port=FLAGS["rendezvous-port"].value, logs=FLAGS.logs, verbose=FLAGS.verbose,
      tensorboard=FLAGS.tensorboard)
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
