"""The reference pages generated from the code: stored in docs/reference/ (so links to them work
in the repository), written anew by `python docs/hooks.py`, and checked by the suite to be what
the code generates now (tests/test_docs.py), so they cannot drift from the schema, the flags,
the exit codes or the modules. MkDocs' hook adds the changelog page, from CHANGELOG.md."""

import ast
import importlib
import pathlib
import re

from mkdocs.structure.files import File

GENERATED = {
    "reference/config.md": ("tfdist.config.reference", "markdown"),
    "reference/cli.md": ("tfdist.cli.reference", "markdown"),
    "reference/exit-codes.md": ("tfdist.cli.reference", "exit_codes_markdown"),
    "reference/keras-arguments.md": ("tfdist.training.keras_arguments", "markdown"),
    "reference/modules.md": (__name__, "module_map"),
}
DOCS = pathlib.Path(__file__).parent


def generated(path: str) -> str:
  """The text of the generated page `path` (a key of `GENERATED`), as the code makes it now."""
  module, function = GENERATED[path]
  found = globals() if module == __name__ else vars(importlib.import_module(module))
  return found[function]()


def module_map() -> str:
  """The source map: every package of tfdist with its docstring's first paragraph, every module
  with its docstring's first sentence, read from the source (nothing imported)."""
  root = DOCS.parent / "tfdist"
  out = ["# Modules", "",
         "Generated from each module's docstring (`python docs/hooks.py`). Data flows one way, "
         "and a room never imports one above it: YAML -> `config` -> `strategy` -> `training` "
         "-> callbacks; `launch` -> plan -> processes; `machine`, `progress`, `errors` and "
         "`exit_codes` sit below every room (tests/test_layering.py holds the order).", ""]
  for package in sorted([root, *(p for p in root.iterdir() if (p / "__init__.py").exists())]):
    name = "tfdist" if package == root else f"tfdist/{package.name}"
    out += [f"## `{name}/`", "", _doc(package / "__init__.py", paragraph=True), "",
            "| module | what it is |", "|---|---|"]
    for module in sorted(package.glob("*.py")):
      if module.name not in ("__init__.py", "__main__.py"):
        out.append(f"| `{module.name}` | {_doc(module)} |")
    for sub in sorted(p.parent for p in package.glob("*/__init__.py") if package != root):
      out.append(f"| `{sub.name}/` | {_doc(sub / '__init__.py')} |")
      out += [f"| `{sub.name}/{m.name}` | {_doc(m)} |" for m in sorted(sub.glob("*.py"))
              if m.name != "__init__.py"]
    out.append("")
  return "\n".join(out) + "\n"


def _doc(path: pathlib.Path, paragraph: bool = False) -> str:
  """A module's docstring: its first paragraph, or its first sentence, on one line."""
  text = (ast.get_docstring(ast.parse(path.read_text())) or "").split("\n\n")[0]
  text = " ".join(text.split())
  if not paragraph:
    text = re.split(r"(?<=[a-z)`'])\. ", text, maxsplit=1)[0].rstrip(".") + "."
  return text.replace("|", "\\|")


def on_files(files, config):
  changelog = pathlib.Path(config["docs_dir"]).parent / "CHANGELOG.md"
  files.append(File.generated(config, "reference/changelog.md", content=changelog.read_text()))
  return files


if __name__ == "__main__":
  import sys
  sys.path.insert(0, str(DOCS.parent))
  for page in GENERATED:
    (DOCS / page).write_text(generated(page))
    print(f"wrote docs/{page}")
