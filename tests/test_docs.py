"""The docs site (issue 38): built strictly (a warning fails it), its generated references
complete (every config key, every command and its own flags, every exit code), and every code
block of the site and README.md run as a reader would run it, or marked with why not
(tests/docs_blocks.py), so the docs cannot go stale."""

import html
import json
import os
import re
import signal
import subprocess
import sys

import pytest

import tfdist
from tests import docs_blocks
from tests.docs_blocks import REPO
from tests.launching import ENV

PAGES = docs_blocks.pages()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
  """The site, built with `mkdocs build --strict` as README says."""
  out = tmp_path_factory.mktemp("site")
  done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                         str(out)], cwd=REPO, env=ENV, capture_output=True, text=True,
                        timeout=240)
  assert done.returncode == 0, done.stderr[-4000:]
  return out


def _text(site, page: str) -> str:
  return html.unescape((site / page / "index.html").read_text())


def test_every_config_key_is_in_the_config_reference(site):
  from tfdist.config import reference, schema
  text = _text(site, "reference/config")
  keys = [key for key, _ in reference.rows()]
  missing = [key for key in keys if key not in text]
  assert not missing, missing
  for section in ("cluster", "task", "strategy", "devices", "training", "checkpoint",
                  "tensorboard", "parallel"):  # Every section of the schema has its table.
    fields = [f.name for f in __import__("dataclasses").fields(getattr(schema.Config(),
                                                                       section).__class__)
              ] if section != "task" else ["type", "index"]
    for name in fields:
      if name not in ("options", "addresses"):
        assert f"{section}.{name}" in keys, (section, name)
  from tfdist.config import strategies
  for name in strategies.names():
    for field in __import__("dataclasses").fields(strategies.kind(name).options):
      assert f"strategy.{field.name}" in text and name in text, (name, field.name)


def test_every_command_and_only_its_own_flags_are_in_the_cli_reference(site):
  from tfdist.cli.main import COMMAND_FLAGS, COMMANDS
  sections = _text(site, "reference/cli").split("<h2 ")
  for command in COMMANDS:
    (section,) = [s for s in sections if re.match(rf'id="tfdist-{command}"', s)]
    flags = set(re.findall(r"<td><code>--([a-z-]+)", section))  # The flag table's rows.
    assert flags == set(COMMAND_FLAGS[command]), (command, flags)


def test_every_exit_code_is_in_its_reference(site):
  from tfdist import exit_codes
  text = _text(site, "reference/exit-codes")
  for name in (n for n in dir(exit_codes) if n.isupper()):
    assert name in text and str(getattr(exit_codes, name)) in text, name


def test_the_api_reference_renders_the_public_docstrings_and_search_finds_pages(site):
  text = _text(site, "reference/api")
  for name in ("tfdist.fit", "tfdist.TrainingLoop", "tfdist.load_config",
               "tfdist.parallel.split", "tfdist.serving.BatchingPredictor",
               "tfdist.launch.launch"):
    assert name in text, name
  assert "Args:" not in text  # Rendered as sections, not raw Google-style text.
  index = json.loads((site / "search" / "search_index.json").read_text())
  titles = {doc["title"] for doc in index["docs"]}
  assert {"Five-minute quickstart", "Troubleshooting", "Choosing a strategy"} <= titles


def test_the_stored_reference_pages_are_what_the_code_generates():
  import importlib.util
  spec = importlib.util.spec_from_file_location("hooks", REPO / "docs" / "hooks.py")
  hooks = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(hooks)
  for page in hooks.GENERATED:
    assert (REPO / "docs" / page).read_text() == hooks.generated(page), (
        f"docs/{page} is not what the code generates: run `python docs/hooks.py`")


def test_every_link_of_the_readme_resolves_in_the_repository():
  """README.md is read on GitHub and in a checkout, before any `mkdocs build`."""
  text = (REPO / "README.md").read_text()
  links = [link for link in re.findall(r"\]\(([^)\s#]+)", text) if "://" not in link]
  assert len(links) > 10, links  # The pattern still finds the README's links.
  missing = [link for link in links if not (REPO / link).exists()]
  assert not missing, missing


def test_every_code_block_runs_or_says_why_not():
  for path in PAGES:
    for block in docs_blocks.blocks(path):
      assert block.language in (*docs_blocks.CODE, "text"), (
          f"{block.where}: a block needs a language (text for output)")
      if block.language == "text":
        continue
      if block.reason is not None:
        assert len(block.reason) > 10, f"{block.where}: say why it is not run"
      elif block.test:
        assert block.name in (REPO / block.test).read_text(), (
            f"{block.where}: {block.test} does not run {block.name!r}")
      else:
        assert block.language in ("python", "bash", "yaml"), (
            f"{block.where}: a {block.language} block is run by nothing; mark it")


def test_readmes_snippets_the_quickstart_runs_are_the_quickstarts_own_lines():
  """README's "the quickstart page runs ..." blocks are excerpts of the quickstart, line for
  line (comments apart), so what the quickstart runs is what README shows."""
  quickstart = (REPO / "docs" / "tutorials" / "quickstart.md").read_text()
  marked = [b for b in docs_blocks.blocks(REPO / "README.md")
            if b.reason and b.reason.startswith("the quickstart page runs")]
  assert len(marked) == 3
  for block in marked:
    for line in filter(str.strip, block.code.splitlines()):
      assert line.split("  #")[0].rstrip() in quickstart, f"{block.where}: {line!r}"


def _runnable(path) -> bool:
  return any(b.language in ("python", "bash", "yaml") and b.reason is None and b.test is None
             for b in docs_blocks.blocks(path))


@pytest.mark.parametrize("path", [p for p in PAGES if _runnable(p)],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_the_pages_code_runs_as_written(path, tmp_path):
  """The page's files written, its YAML loaded as configs, its Python run in one process (in
  order, sharing names, as a reader pastes them), then its commands, in a folder with the
  checkout's `configs/`."""
  (tmp_path / "configs").symlink_to(REPO / "configs")
  blocks = [b for b in docs_blocks.blocks(path) if b.reason is None and b.test is None]
  for block in blocks:
    if block.file:
      (tmp_path / block.file).write_text(block.code)
  for number, block in enumerate(b for b in blocks if b.language == "yaml"):
    config = tmp_path / (block.file or f"block-{number}.yaml")
    config.write_text(block.code)
    tfdist.load_config(config, environ={})
  python = [b for b in blocks if b.language == "python" and not b.file]
  if python:
    program = "".join(f"print('BLOCK {b.where}', flush=True)\n"
                      f"exec(compile({b.code!r}, {b.where!r}, 'exec'))\n" for b in python)
    _run([sys.executable, "-c", program], tmp_path)
  for block in (b for b in blocks if b.language == "bash" and not b.file):
    _run(["bash", "-e", "-c", block.code], tmp_path, block.where)


def _run(argv, folder, where=None):
  process = subprocess.Popen(argv, cwd=folder, env={**ENV, "TFDIST_TRACEBACK": "1"},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
  try:
    output, _ = process.communicate(timeout=240)
  finally:
    try:
      os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass
  assert process.returncode == 0, f"{where or ''}\n{output[-4000:]}"


def test_every_environment_variable_tfdist_reads_or_sets_is_documented():
  page = (REPO / "docs" / "reference" / "environment.md").read_text()
  names = set()
  for path in (REPO / "tfdist").rglob("*.py"):
    names |= set(re.findall(r"\b(TFDIST_[A-Z_]+|KERAS_DISTRIBUTION_[A-Z_]+|RAY_ADDRESS)\b",
                            path.read_text()))
  missing = sorted(n for n in names if f"`{n}`" not in page)
  assert not missing, missing


def test_the_build_notes_stay_a_record_of_decisions_a_newcomer_can_read():
  """Decisions grouped by subsystem, current, under about 800 lines (issue 60); the module map
  is the generated page, not a copy that drifts."""
  text = (REPO / "BUILD_NOTES.md").read_text()
  assert len(text.splitlines()) <= 800, "BUILD_NOTES.md: fold superseded decisions away"
  assert "docs/reference/modules.md" in text
  assert not re.search(r"^#+ .*(This turn|This session)", text, flags=re.M), (
      "a section per session: group decisions by subsystem")
