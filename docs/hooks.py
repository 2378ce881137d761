"""The reference pages generated from the code: stored in docs/reference/ (so links to them work
in the repository), written anew by `python docs/hooks.py`, and checked by the suite to be what
the code generates now (tests/test_docs.py), so they cannot drift from the schema, the flags or
the exit codes. MkDocs' hook adds the changelog page, from CHANGELOG.md."""

import importlib
import pathlib

from mkdocs.structure.files import File

GENERATED = {
    "reference/config.md": ("tfdist.config.reference", "markdown"),
    "reference/cli.md": ("tfdist.cli.reference", "markdown"),
    "reference/exit-codes.md": ("tfdist.cli.reference", "exit_codes_markdown"),
    "reference/keras-arguments.md": ("tfdist.training.keras_arguments", "markdown"),
}
DOCS = pathlib.Path(__file__).parent


def generated(path: str) -> str:
  """The text of the generated page `path` (a key of `GENERATED`), as the code makes it now."""
  module, function = GENERATED[path]
  return getattr(importlib.import_module(module), function)()


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
