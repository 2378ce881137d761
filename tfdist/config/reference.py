"""The config reference, generated from the schema: every key of every section, its type, its
default, its rule and its meaning (the section's docstring). The docs site's
`reference/config.md` is this module's `markdown()`, so the page cannot drift from the loader.

```python
from tfdist.config import reference
for key, row in reference.rows():      # ("training.epochs", Row(type="int", default="1", ...))
  print(key, row.default)
```
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Iterator

from tfdist.config import honoured, schema, strategies


@dataclasses.dataclass(frozen=True)
class Row:
  """One key of the config.

  Attributes:
    type: its Python type as the schema declares it (`Literal[...]` lists the choices).
    default: its default, as YAML would write it.
    rule: the rule the loader checks beyond the type, or "".
    meaning: the sentence the schema's docstring gives it.
  """
  type: str
  default: str
  rule: str
  meaning: str


def attributes(cls: type) -> dict[str, str]:
  """{name: meaning} from the `Attributes:` section of `cls`'s docstring. Pure."""
  text = inspect.getdoc(cls) or ""
  if "Attributes:" not in text:
    return {}
  found, name = {}, None
  for line in text.split("Attributes:", 1)[1].splitlines():
    match = re.match(r"^  (\w+): (.*)$", line)
    if match:
      name = match[1]
      found[name] = match[2]
    elif name and line.startswith("    "):
      found[name] += " " + line.strip()
    elif line.strip() and not line.startswith(" "):
      break
  return found


def _yaml(value) -> str:
  if value is None:
    return "null"
  if isinstance(value, bool):
    return str(value).lower()
  if isinstance(value, tuple):
    return "[" + ", ".join(_yaml(v) for v in value) + "]"
  return str(value)


def _rows_of(cls: type, prefix: str, skip=()) -> Iterator[tuple[str, Row]]:
  meanings = attributes(cls)
  for field in dataclasses.fields(cls):
    if field.name in skip or not field.compare:
      continue
    rule = field.metadata.get("rule", (None, ""))[1]
    default = (field.default if field.default is not dataclasses.MISSING else "(required)")
    yield f"{prefix}{field.name}", Row(str(field.type), _yaml(default), rule,
                                       meanings.get(field.name, ""))


def rows() -> Iterator[tuple[str, Row]]:
  """Every key of the config, dotted (`training.epochs`), with its row; a strategy's options
  as `strategy.<option>`, once per strategy that has it (`Row.meaning` says which)."""
  yield from _rows_of(schema.ClusterConfig, "cluster.", skip=("addresses",))
  yield from _rows_of(schema.TaskConfig, "task.")
  yield "strategy.name", Row("str", "default (the cluster decides when the section is absent)",
                             "one of " + ", ".join(strategies.names()),
                             "the tf.distribute strategy to make; its options sit beside it, "
                             "each listed below with the strategy that takes it")
  for name in strategies.names():
    for key, row in _rows_of(strategies.kind(name).options, "strategy."):
      yield key, dataclasses.replace(row, meaning=f"`{name}`: {row.meaning}")
  for section, cls in list(schema.SECTIONS.items())[3:]:
    yield from _rows_of(cls, f"{section}.")


def _cell(text: str) -> str:
  return text.replace("|", "\\|").replace("\n", " ")


def markdown() -> str:
  """The config reference page, in Markdown: a table per section."""
  out = ["# Config reference", "",
         "Generated from `tfdist/config/schema.py`, the declarations the loader checks a YAML "
         "file against. Every key is optional; a key not listed here is refused in one line "
         "naming it. Precedence, lowest first: these defaults, the config file, the "
         "environment's `TF_CONFIG` (its addresses and task), the `--task` flag. The last "
         "column is `tfdist/config/honoured.py`'s table: how the training paths (" +
         ", ".join(honoured.PATHS) + ") apply each key, and which refuse it when it is set, "
         "in one line naming it.", ""]
  section = None
  for key, row in rows():
    head = key.split(".")[0]
    if head != section:
      section = head
      summary = (inspect.getdoc(schema.SECTIONS[head]) or "").split("Attributes:")[0].strip()
      out += ["", f"## `{head}`", "", summary, "",
              "| key | type | default | rule | meaning | what each training path does |",
              "|---|---|---|---|---|---|"]
    out.append(f"| `{key}` | `{_cell(row.type)}` | `{_cell(row.default)}` | {_cell(row.rule)} "
               f"| {_cell(row.meaning)} | {_cell(honoured.summary(key))} |")
  return "\n".join(out + ["", *support_markdown()]) + "\n"


def support_markdown() -> list[str]:
  """The lines of a table of the keys only some strategies honour (`honoured.Needs`), a column
  per strategy: the config's rules refuse a key where its cell is empty."""
  names = strategies.names()
  out = ["## What each strategy supports", "",
         "The keys only some strategies honour; set under another, each is refused in one "
         "line naming it.", "", "| key | " + " | ".join(names) + " |",
         "|---|" + "---|" * len(names)]
  for key, decision in honoured.DECISIONS.items():
    if decision.needs:
      values = " or ".join(map(honoured.shown, decision.needs.values or ()))
      cells = ["yes" if decision.needs.feature in strategies.kind(n).supports else ""
               for n in names]
      out.append(f"| `{key}`{': ' + values if values else ''} | " + " | ".join(cells) + " |")
  return out
