"""The code blocks of README.md and the docs site, as the docs test runs them.

A block's mark is an HTML comment on the line before its fence (nothing shows on the page):

- `<!-- file: NAME -->`: saved as NAME in the page's folder before the page's blocks run
  (a script the page's commands run, a config they read);
- `<!-- not run: REASON -->`: not run, and why (a cluster, a GPU, an install);
- `<!-- run by tests/FILE.py: NAME -->`: that test runs it, looking it up with `named(NAME)`;
- no mark: run by tests/test_docs.py, in the page's order: Python blocks in one process, bash
  blocks with `bash -e`, YAML blocks loaded as configs.

`text` blocks show output and are not code.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
CODE = ("python", "bash", "yaml", "json", "diff")
_FENCE = re.compile(r"^(?P<indent> *)```(?P<language>[\w-]*)\s*$")
_MARK = re.compile(r"^\s*<!-- (?:file: (?P<file>\S+)|not run: (?P<reason>.*?)|run by "
                   r"(?P<test>tests/\S+\.py): (?P<name>.+?)) -->\s*$")


@dataclasses.dataclass(frozen=True)
class Block:
  page: str       # relative to the repository
  line: int       # of the opening fence, from 1
  language: str
  code: str
  file: str | None = None
  reason: str | None = None
  test: str | None = None
  name: str | None = None

  @property
  def where(self) -> str:
    return f"{self.page}:{self.line}"


def pages() -> list[pathlib.Path]:
  return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def blocks(path: pathlib.Path) -> list[Block]:
  """Every fenced block of a Markdown file, with its mark."""
  lines = path.read_text().splitlines()
  found, i = [], 0
  while i < len(lines):
    fence = _FENCE.match(lines[i])
    if not fence:
      i += 1
      continue
    indent, end = len(fence["indent"]), i + 1
    while not re.match(rf"^ {{{indent}}}```\s*$", lines[end]):
      end += 1
    code = "\n".join(line[indent:] for line in lines[i + 1:end]) + "\n"
    previous = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
    mark = _MARK.match(previous)
    marks = {k: v for k, v in (mark.groupdict() if mark else {}).items() if v is not None}
    found.append(Block(str(path.relative_to(REPO)), i + 1, fence["language"], code, **marks))
    i = end + 1
  return found


def named(name: str) -> Block:
  """The one block marked `<!-- run by tests/...: NAME -->`."""
  matches = [b for page in pages() for b in blocks(page) if b.name == name]
  assert len(matches) == 1, f"{len(matches)} blocks are named {name!r}"
  return matches[0]
