"""The CLI and exit-code references, generated from each command's flag declarations and
docstring and `tfdist.exit_codes`: the docs site's `reference/cli.md` and
`reference/exit-codes.md` are `markdown()` and `exit_codes_markdown()`, so the pages list what
`tfdist COMMAND --help` lists, each command only its own flags.

```python
from tfdist.cli import reference
print(reference.markdown().splitlines()[0])     # "# Command-line reference"
```
"""

from __future__ import annotations

import ast
import inspect

import tfdist.exit_codes as exit_codes
from tfdist.cli.main import COMMANDS, RENAMED, SUMMARIES, define_flags, described


def _cell(text: str) -> str:
  return " ".join(text.replace("|", "\\|").split())


def markdown() -> str:
  """The CLI reference page, in Markdown: per command its usage, what it does and its flags."""
  define_flags()  # Once: a second call defines nothing.
  summaries = dict(SUMMARIES)
  out = ["# Command-line reference", "",
         "Generated from each command's own flag declarations (`FLAGS_DECLARED` in "
         "`tfdist/cli/COMMAND.py`) and text: what `tfdist COMMAND --help` prints. Every "
         "command exits with the codes of the [exit-code reference](exit-codes.md); a bad flag "
         "or config is one line and exit 2.", ""]
  for name, command in COMMANDS.items():
    out += [f"## `tfdist {name}`", "", summaries[name].replace("\n", " ") + ".", "",
            "```text", f"usage: {command.USAGE}", "```", "",
            inspect.cleandoc(command.__doc__ or ""), "",
            "| flag | default | meaning |", "|---|---|---|"]
    # An enum's choices as a/b/c: a pipe splits a table's cell on GitHub, in code too.
    out += [f"| `{spelling.replace('|', '/')}` | `{default}` | {_cell(meaning)} |"
            for spelling, default, meaning in described(name)]
    out.append("")
  out += ["## Renamed commands", "",
          "Old spellings that still run, after a one-line notice, until the next release:", ""]
  out += [f"- `tfdist {old}` is `tfdist {new}`." for old, new in RENAMED.items()]
  return "\n".join(out) + "\n"


def codes() -> list[tuple[str, int, str]]:
  """(name, code, meaning) of every constant of `tfdist.exit_codes`, in its order. Pure."""
  tree = ast.parse(inspect.getsource(exit_codes))
  found = []
  for node, after in zip(tree.body, tree.body[1:] + [None]):
    if isinstance(node, ast.Assign) and isinstance(after, ast.Expr):
      name = node.targets[0].id
      found.append((name, getattr(exit_codes, name), inspect.cleandoc(after.value.value)))
  return found


def exit_codes_markdown() -> str:
  """The exit-code reference page, in Markdown."""
  out = ["# Exit codes", "",
         "Generated from `tfdist/exit_codes.py`: what a task's code means to its launcher and "
         "the launcher's to a shell, Slurm or Kubernetes.", "",
         "| code | name | meaning |", "|---|---|---|"]
  for name, code, meaning in codes():
    shown = f"{code} + signal" if name == "SIGNALLED" else str(code)
    out.append(f"| `{shown}` | `{name}` | {_cell(meaning)} |")
  return "\n".join(out) + "\n"
