"""How a `tfdist` command declares its flags, and what is made from the declarations.

Each command declares its own flags beside its code (its module's `FLAGS_DECLARED`, a tuple of
`Flag`); from those come absl's flags (`define`), the command's usage line (`usage`), its
`--help` list and the CLI reference (`described`). A name has one meaning: a flag several
commands read is one declaration they all list (below), and `define` refuses two declarations
of one name. An old spelling kept for a release is a command's `OLD_SPELLINGS` entry, read
through `renamed_value` with a one-line notice. Multi-word flags are spelled with hyphens
(`--dry-run`), as torchrun and accelerate spell theirs; read them as `FLAGS["dry-run"].value`.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from absl import flags

from tfdist.errors import ConfigError

_DEFINERS = {"string": flags.DEFINE_string, "integer": flags.DEFINE_integer,
             "float": flags.DEFINE_float, "bool": flags.DEFINE_bool, "enum": flags.DEFINE_enum}


@dataclasses.dataclass(frozen=True)
class Flag:
  """One flag of the CLI: its name, type, default, meaning and bounds.

  Args:
    name: the flag's name, hyphenated (`dry-run`).
    kind: "string", "integer", "float", "bool" or "enum".
    default: the value when the flag is not given.
    help: what it does, in one meaning whichever command reads it.
    metavar: how the usage line writes its value (`--port PORT`); an enum's is its choices.
    choices: an enum's values.
    lower, upper: an integer's or float's bounds (inclusive).
    required: written without brackets in the usage (the command refuses its absence).

  Example:

  ```python
  Flag("max-restarts", "integer", 0, "restarts allowed after a failure.", metavar="N", lower=0)
  ```
  """

  name: str
  kind: str
  default: Any
  help: str
  metavar: str = "VALUE"
  choices: tuple[str, ...] = ()
  lower: float | None = None
  upper: float | None = None
  required: bool = False

  def spelling(self) -> str:
    """`--name METAVAR`, or `--name` for a boolean."""
    if self.kind == "bool":
      return f"--{self.name}"
    return f"--{self.name} {'|'.join(self.choices) if self.kind == 'enum' else self.metavar}"

  def define(self) -> None:
    """Defines it among absl's flags."""
    bounds = {k: v for k, v in (("lower_bound", self.lower), ("upper_bound", self.upper))
              if v is not None}
    args = (self.name, self.default) + ((list(self.choices),) if self.kind == "enum" else ())
    _DEFINERS[self.kind](*args, self.help, **bounds)


# Flags that several commands read: one declaration each, listed by every command reading it.
TASK = Flag("task", "string", None, "The task this process runs, as TYPE:INDEX (e.g. worker:1). "
            "Overrides the config file's task and TF_CONFIG's.", metavar="TYPE:INDEX")
PORT = Flag("port", "integer", None, "The port it serves HTTP on (default: a free one).",
            metavar="PORT", lower=1, upper=65535)
TASK_PORT = Flag(
    "task-port", "integer", None, "The port each task's TensorFlow server listens on (launch "
    "--backend slurm, export slurm|kubernetes). Kubernetes: every pod's (default 2222). Slurm: "
    "the first on each node, tasks sharing a node counting up from it (default: one of the "
    "job's own, from its job id, so jobs sharing a node do not collide). A local launch picks "
    "free ports or takes the config's addresses, and Ray's its actors' nodes, so they refuse "
    "it.", metavar="PORT", lower=1, upper=65535)
MAX_RESTARTS = Flag(
    "max-restarts", "integer", 0, "Restarts allowed after a failure (a preemption's restart "
    "is not counted). launch: of the whole synchronous cluster, or of a failed "
    "parameter-server worker; a data worker or dispatcher (no training state) is restarted "
    "alone 3 times of its own first. export kubernetes --kind jobset: the JobSet's "
    "failurePolicy.maxRestarts.", metavar="N", lower=0)
MAX_BATCH_SIZE = Flag("max-batch-size", "integer", 32, "Rows per batch at most.", metavar="N",
                      lower=1)
MAX_WAIT_MS = Flag("max-wait-ms", "float", 2.0, "How long a batch may wait for more requests.",
                   metavar="MS", lower=0)


def define(declared: dict[str, tuple[Flag, ...]]) -> None:
  """Defines every command's flags among absl's, each name once.

  Args:
    declared: {command: its flags}.

  Raises:
    ValueError: two commands declare one name differently (a name has one meaning).

  Example:

  ```python
  define({"check": (TASK,), "cluster-server": (TASK,)})
  ```
  """
  seen: dict[str, tuple[Flag, str]] = {}
  for command, declarations in declared.items():
    for flag in declarations:
      first = seen.setdefault(flag.name, (flag, command))
      if first[0] != flag:
        raise ValueError(f"--{flag.name} is declared twice with two meanings: by tfdist "
                         f"{first[1]} and tfdist {command}; declare it once and list it in both")
  for flag, _ in seen.values():
    if flag.name not in flags.FLAGS:
      flag.define()


def usage(command: str, arguments: str, declared: tuple[Flag, ...], trailing: str = "") -> str:
  """A command's usage line: its arguments, every flag it declares, what follows them.

  Example:

  ```python
  usage("check", "[CONFIG]", (TASK,))  # "tfdist check [CONFIG] [--task TYPE:INDEX]"
  ```
  """
  shown = [f.spelling() if f.required else f"[{f.spelling()}]" for f in declared]
  return " ".join(part for part in (f"tfdist {command}", arguments, *shown, trailing) if part)


def described(declared: tuple[Flag, ...],
              old_spellings: dict[str, str]) -> list[tuple[str, str, str]]:
  """(spelling, default, meaning) of each flag a command reads, its declared ones first, then
  its old spellings; the default as the help writes it ("none" for None). What `--help` and the
  docs' CLI reference both show."""
  rows = [(f.spelling(), "none" if f.default is None else str(f.default).lower(), f.help)
          for f in declared]
  by_name = {f.name: f for f in declared}
  for old, new in old_spellings.items():
    rows.append((by_name[new].spelling().replace(f"--{new}", f"--{old}", 1), "none",
                 f"The old spelling of --{new} (a notice; gone in the next release)."))
  return rows


def flags_help(rows: list[tuple[str, str, str]]) -> str:
  """`described` rows, one flag per two lines, as `--help` prints them."""
  return "\n".join(f"  {spelling} (default: {default})\n      {meaning}"
                   for spelling, default, meaning in rows)


def renamed_value(command: str, new_name: str, old_names: tuple[str, ...]):
  """`--NEW`'s value, or an old spelling's (for `command`) after a one-line notice.

  Raises:
    ConfigError: the new and an old spelling, or two old ones, are given and differ.
  """
  new = flags.FLAGS[new_name]
  given = [(f"--{name}", flags.FLAGS[name].value) for name in old_names
           if flags.FLAGS[name].present]
  if not given:
    return new.value
  values = {value for _, value in given} | ({new.value} if new.present else set())
  if len(values) > 1:
    spelt = ", ".join(f"{name} {value}" for name, value in given)
    raise ConfigError(f"must be given alone; {spelt} is its old spelling",
                      key=f"--{new_name}", received=new.value if new.present else None)
  for name, _ in given:
    print(f"tfdist {command}: {name} is now spelled --{new_name}; the old spelling goes in "
          "the next release", file=sys.stderr, flush=True)
  return given[0][1]
