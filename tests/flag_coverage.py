"""Every flag of every command reaches a test through the CLI (issue 58): each `tfdist` run the
suite makes appends its command and the flags it was given to one file (`tfdist.cli.main.
FLAGS_SEEN`); a whole suite that passed but left a (command, flag) unseen fails, naming it."""

import os
import pathlib
import tempfile

from tfdist.cli.main import COMMAND_FLAGS, FLAGS_SEEN


def start() -> None:
  """Points this process and every process it starts at a fresh record."""
  handle, path = tempfile.mkstemp(prefix="tfdist-flags-seen-")
  os.close(handle)
  os.environ[FLAGS_SEEN] = path


def unexercised(lines: list[str]) -> list[str]:
  """The `tfdist COMMAND --flag` pairs of `COMMAND_FLAGS` no line of the record has."""
  seen = set()
  for line in lines:
    command, *given = line.split()
    seen |= {(command, flag) for flag in given}
  return [f"tfdist {command} --{flag}" for command, names in COMMAND_FLAGS.items()
          for flag in names if (command, flag) not in seen]


def finish() -> list[str]:
  """The pairs the record lacks; removes the record."""
  path = pathlib.Path(os.environ.pop(FLAGS_SEEN))
  lines = path.read_text().splitlines()
  path.unlink()
  return unexercised(lines)


def whole_suite(config) -> bool:
  """Whether this run ran every test: no paths but the suite's own, no -k, -m or --lf, and
  not only collected them."""
  option = config.option
  if option.keyword or option.markexpr or getattr(option, "lf", False) or \
      getattr(option, "deselect", None) or option.collectonly:
    return False
  return [(config.rootpath / arg).resolve() for arg in config.args] == \
      [(config.rootpath / path).resolve() for path in config.getini("testpaths")]
