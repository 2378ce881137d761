"""The `tfdist` command: `tfdist COMMAND [ARGS] [FLAGS]`.

A user's mistake ends the command with one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import contextlib
import os
import sys

from absl import app, flags, logging

from tfdist.cli import (check, env, export, launch, model_server, plan, serve,
                        tensorboard)
from tfdist.cli.flags import define_flags, flags_help
from tfdist.errors import TfdistError
from tfdist.machine import banners

EXIT_USAGE = 2
IN_PROCESS_TENSORFLOW = {"check", "env", "export", "model-server", "plan", "serve"}
COMMANDS = {"check": check, "launch": launch, "serve": serve, "export": export,
            "tensorboard": tensorboard, "env": env, "plan": plan, "model-server": model_server}


HELP = ("tfdist: train Keras models under tf.distribute strategies from one YAML config.\n\n"
        "commands:\n"
        "  launch   start every task of the config's cluster (or this host's task), supervised\n"
        "  check    validate a config and show what it will do\n"
        "  serve    run a worker or ps server of a parameter-server cluster\n"
        "  export   print an sbatch script or Kubernetes manifests for the cluster, or a\n"
        "           SavedModel for serving\n"
        "  tensorboard  TensorBoard on a run's logs, on 127.0.0.1\n"
        "  env      this machine's facts for a bug report; with a config, every task's\n"
        "  plan     memory per device under data parallelism and a split; what fits\n"
        "  model-server  a .keras file or SavedModel over HTTP (TF Serving's REST), batched\n\n"
        "`tfdist COMMAND --help` lists a command's flags with their defaults.")


def _usage() -> str:
  return "usage: " + " | ".join(command.USAGE for command in COMMANDS.values())


def help_text(command: str | None) -> str:
  """`tfdist --help`, or `tfdist COMMAND --help`: usage and every flag with its default."""
  if command not in COMMANDS:
    return f"{HELP}\n\n{_usage()}"
  doc = (COMMANDS[command].__doc__ or "").strip()
  return f"usage: {COMMANDS[command].USAGE}\n\n{doc}\n\nflags:\n{flags_help(command)}"


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
    sys.exit(EXIT_USAGE)


def run(argv: list[str]) -> int:
  """Dispatches to a command; returns the exit code."""
  if len(argv) < 2 or argv[1] not in COMMANDS:
    received = f" Received: {argv[1]!r}" if len(argv) > 1 else ""
    print(f"tfdist: the command must be one of {', '.join(COMMANDS)}.{received}\n{_usage()}",
          file=sys.stderr)
    return EXIT_USAGE
  if not flags.FLAGS["verbosity"].present:  # TensorFlow's Python INFO lines (export: pages).
    logging.set_verbosity(logging.WARNING)
  # Commands that load TensorFlow here would print its start-up banners (twice); the launcher
  # keeps its tasks' banners in their logs itself.
  quiet = banners.stderr_without_banners() if argv[1] in IN_PROCESS_TENSORFLOW else \
      contextlib.nullcontext()
  try:
    with quiet:
      return COMMANDS[argv[1]].run(argv[2:], task=flags.FLAGS.task)
  except TfdistError as e:
    print(f"tfdist {argv[1]}: {e}", file=sys.stderr)
    return EXIT_USAGE


def main() -> None:
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ INFO lines, for this CLI.
  define_flags()
  app.run(run, flags_parser=_parse_flags)
