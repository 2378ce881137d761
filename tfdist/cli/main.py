"""The `tfdist` command: `tfdist COMMAND [ARGS] [FLAGS]`.

A user's mistake ends the command with one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags

from tfdist.cli import check, export, launch, serve
from tfdist.cli.flags import define_flags
from tfdist.errors import TfdistError

EXIT_USAGE = 2
COMMANDS = {"check": check, "launch": launch, "serve": serve, "export": export}


def _usage() -> str:
  return "usage: " + " | ".join(command.USAGE for command in COMMANDS.values())


def _parse_flags(argv: list[str]) -> list[str]:
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
  try:
    return COMMANDS[argv[1]].run(argv[2:], task=flags.FLAGS.task)
  except TfdistError as e:
    print(f"tfdist {argv[1]}: {e}", file=sys.stderr)
    return EXIT_USAGE


def main() -> None:
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ INFO lines, for this CLI.
  define_flags()
  app.run(run, flags_parser=_parse_flags)
