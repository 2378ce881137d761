"""The `tfdist` command: `tfdist COMMAND [ARGS] [FLAGS]`.

A user's mistake ends the command with one line on stderr and exit code 2, never a traceback:
a bad config or value, a missing argument, and a flag of another command (each command reads
the flags its module declares, `COMMAND_FLAGS`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from absl import app, flags, logging

from tfdist.cli import (check, cluster_server, data_service, env, estimate, export, launch,
                        model_export, model_server, tensorboard)
from tfdist.cli import flags as cli_flags
from tfdist.config.loader import parse_task_flag
from tfdist.errors import TfdistError
from tfdist.exit_codes import SIGNALLED, USAGE
from tfdist.machine import banners

IN_PROCESS_TENSORFLOW = {"check", "env", "export", "model-server", "model-export", "estimate",
                         "cluster-server", "data-service"}
COMMANDS = {"check": check, "launch": launch, "cluster-server": cluster_server,
            "data-service": data_service, "export": export,
            "tensorboard": tensorboard, "env": env, "estimate": estimate,
            "model-server": model_server, "model-export": model_export}
RENAMED = {("serve",): "cluster-server", ("plan",): "estimate",
           ("export", "serving"): "model-export"}
"""Old spellings, kept for this release (0.1) with a notice; gone in the next."""
COMMAND_FLAGS = {name: tuple(f.name for f in command.FLAGS_DECLARED) +
                 tuple(getattr(command, "OLD_SPELLINGS", {}))
                 for name, command in COMMANDS.items()}
"""The flags each command reads, its declared ones then its old spellings: a command given
another's flag refuses it."""


def define_flags() -> None:
  """Defines every command's declared flags among absl's (once: a second call does nothing)."""
  cli_flags.define({name: command.FLAGS_DECLARED for name, command in COMMANDS.items()})


def owners() -> dict[str, tuple[str, ...]]:
  """{flag name: the commands reading it}."""
  found: dict[str, tuple[str, ...]] = {}
  for command, names in COMMAND_FLAGS.items():
    for name in names:
      found[name] = found.get(name, ()) + (command,)
  return found


def described(command: str) -> list[tuple[str, str, str]]:
  """(spelling, default, meaning) of each flag `command` reads, as its `--help` lists them."""
  module = COMMANDS[command]
  return cli_flags.described(module.FLAGS_DECLARED, getattr(module, "OLD_SPELLINGS", {}))


SUMMARIES = (
    ("launch", "start every task of the config's cluster (or this host's task), supervised"),
    ("check", "validate a config and show what it will do"),
    ("env", "this machine's facts for a bug report; with a config, every task's"),
    ("estimate", "memory per device under data parallelism and a split, what fits, and\n"
                 "all-reduce time from 2 to 512 devices"),
    ("export", "an sbatch script or Kubernetes manifests for the cluster"),
    ("tensorboard", "TensorBoard on a run's logs, on 127.0.0.1"),
    ("cluster-server", "a worker or ps server of a parameter-server cluster"),
    ("data-service", "the tf.data service's dispatcher or a data worker of the cluster"),
    ("model-server", "a .keras file or SavedModel over HTTP (TF Serving's REST), batched"),
    ("model-export", "a .keras file as a SavedModel for TensorFlow Serving, with batching"),
)
HELP = ("tfdist: train Keras models under tf.distribute strategies from one YAML config.\n\n"
        "commands:\n" +
        "".join(f"  {name:<16}" + summary.replace("\n", "\n" + " " * 18) + "\n"
                for name, summary in SUMMARIES) +
        "\n`tfdist COMMAND --help` lists a command's flags with their defaults.")


def _usage() -> str:
  return "usage: " + " | ".join(command.USAGE for command in COMMANDS.values())


def help_text(command: str | None) -> str:
  """`tfdist --help`, or `tfdist COMMAND --help`: usage and every flag with its default."""
  if command not in COMMANDS:
    return f"{HELP}\n\n{_usage()}"
  doc = (COMMANDS[command].__doc__ or "").strip()
  return (f"usage: {COMMANDS[command].USAGE}\n\n{doc}\n\nflags:\n"
          f"{cli_flags.flags_help(described(command))}")


def _parse_flags(argv: list[str]) -> list[str]:
  before_command = argv[1:argv.index("--")] if "--" in argv else argv[1:]
  if {"-h", "--help", "-help", "--helpfull"} & set(before_command):
    command = next((a for a in before_command if not a.startswith("-")), None)
    print(help_text(command))
    sys.exit(0)
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(f"tfdist: {e}", file=sys.stderr)
    sys.exit(USAGE)


def run(argv: list[str]) -> int:
  """Dispatches to a command; returns the exit code."""
  if len(argv) < 2 or argv[1] not in COMMANDS:
    received = f" Received: {argv[1]!r}" if len(argv) > 1 else ""
    print(f"tfdist: the command must be one of {', '.join(COMMANDS)}.{received}\n{_usage()}",
          file=sys.stderr)
    return USAGE
  if not flags.FLAGS["verbosity"].present:  # TensorFlow's Python INFO lines (export: pages).
    logging.set_verbosity(logging.WARNING)
  # Commands that load TensorFlow here would print its start-up banners (twice); the launcher
  # keeps its tasks' banners in their logs itself.
  quiet = banners.stderr_without_banners() if argv[1] in IN_PROCESS_TENSORFLOW else \
      contextlib.nullcontext()
  try:
    _refuse_foreign_flags(argv[1])
    _record_flags(argv[1], os.environ.get(FLAGS_SEEN))
    task = parse_task_flag(flags.FLAGS.task) if flags.FLAGS.task else None
    with quiet:
      return COMMANDS[argv[1]].run(argv[2:], task=task)
  except (TfdistError, app.UsageError) as e:
    print(f"tfdist {argv[1]}: {e}", file=sys.stderr)
    return USAGE


FLAGS_SEEN = "TFDIST_FLAGS_SEEN"
"""A file each run appends its command and the flags it was given to: how the suite checks
that every flag reaches a test through this CLI (`tests/conftest.py`)."""


def _record_flags(command: str, path: str | None) -> None:
  if path:
    given = [name for name in owners() if flags.FLAGS[name].present]
    with open(path, "a", encoding="utf-8") as seen:
      seen.write(" ".join([command, *given]) + "\n")


def _refuse_foreign_flags(command: str) -> None:
  """A flag given to `command` that only other commands read (absl's own flags, such as
  --verbosity, are every command's).

  Raises:
    app.UsageError: naming the flag and the commands it belongs to.
  """
  for name, commands in owners().items():
    if flags.FLAGS[name].present and command not in commands:
      raise app.UsageError(
          f"--{name} is a flag of {' and '.join(f'tfdist {c}' for c in commands)}, not of "
          f"tfdist {command} (`tfdist {command} --help` lists its flags)")


def renamed(argv: list[str]) -> list[str]:
  """`argv` with an old command spelling replaced by its new name, and a one-line notice."""
  for old, new in RENAMED.items():
    if tuple(argv[1:1 + len(old)]) == old:
      print(f"tfdist: `tfdist {' '.join(old)}` is now `tfdist {new}`; the old name goes in the "
            "next release", file=sys.stderr)
      return [argv[0], new, *argv[1 + len(old):]]
  return argv


def main() -> None:
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ INFO lines, for this CLI.
  define_flags()
  sys.argv = renamed(sys.argv)
  try:
    app.run(run, flags_parser=_parse_flags)
  except BrokenPipeError:  # `tfdist check config.yaml | head`: the reader has what it wanted.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own advice.
    sys.exit(SIGNALLED + signal.SIGPIPE)
