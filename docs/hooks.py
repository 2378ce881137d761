"""MkDocs hooks: the reference pages generated from the code at every build (never stored), so
they cannot drift from the schema, the flags or the exit codes."""

from mkdocs.structure.files import File

GENERATED = {
    "reference/config.md": ("tfdist.config.reference", "markdown"),
    "reference/cli.md": ("tfdist.cli.reference", "markdown"),
    "reference/exit-codes.md": ("tfdist.cli.reference", "exit_codes_markdown"),
    "reference/keras-arguments.md": ("tfdist.training.keras_arguments", "markdown"),
}


def on_files(files, config):
  import importlib
  import pathlib
  for path, (module, function) in GENERATED.items():
    text = getattr(importlib.import_module(module), function)()
    files.append(File.generated(config, path, content=text))
  changelog = pathlib.Path(config["docs_dir"]).parent / "CHANGELOG.md"
  files.append(File.generated(config, "reference/changelog.md", content=changelog.read_text()))
  return files
