"""The public API (the `__all__` of `tfdist`, `tfdist.parallel`, `tfdist.serving`,
`tfdist.launch` and `tfdist.testing`, and the public methods of their classes) is documented as Keras documents its
own: a summary line, `Args:` naming every parameter, `Returns:` where something is returned,
`Raises:` where the function raises, and a fenced example; and every example runs."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("tfdist", "tfdist.parallel", "tfdist.serving", "tfdist.launch", "tfdist.testing")
EXAMPLE = re.compile(r"```python\n(.*?)```", re.S)


def public_api() -> list[tuple[str, object]]:
  """(dotted name, object) for every public function, class and method (methods last in their
  class's name: `tfdist.serving.BatchingPredictor.submit`)."""
  found = []
  for package in PACKAGES:
    module = importlib.import_module(package)
    for name in module.__all__:
      obj = getattr(module, name)
      found.append((f"{package}.{name}", obj))
      if inspect.isclass(obj):
        for attr, member in vars(obj).items():
          if not attr.startswith("_") and inspect.isfunction(member):
            found.append((f"{package}.{name}.{attr}", member))
            METHODS.add(f"{package}.{name}.{attr}")
  return found


METHODS = set()
API = public_api()


def _sections(doc: str) -> dict[str, str]:
  """`Args:`, `Returns:`, ... of a Google-style docstring: each section's indented body."""
  sections, current = {}, None
  for line in doc.splitlines():
    header = re.fullmatch(r"(Args|Arguments|Attributes|Returns|Yields|Raises|Example|Examples):",
                          line.strip())
    if header and not line.startswith(" "):
      current = header.group(1)
      sections[current] = ""
    elif current and (line.startswith(" ") or not line.strip()):
      sections[current] += line + "\n"
    else:
      current = None
  return sections


def _parameters(obj) -> list[str]:
  target = obj.__init__ if inspect.isclass(obj) else obj
  if target is object.__init__:
    return []
  names = [p.name for p in inspect.signature(target).parameters.values()
           if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
  return [n for n in names if n not in ("self", "cls")]


def _body(obj):
  source = textwrap.dedent(inspect.getsource(obj))
  return ast.parse(source).body[0]


def _returns_a_value(obj) -> bool:
  if inspect.isclass(obj):
    return False
  nodes = list(ast.walk(_body(obj)))
  nested = {id(n) for f in nodes[1:] if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                         ast.Lambda)) for n in ast.walk(f)}
  return any(isinstance(n, (ast.Return, ast.Yield)) and n.value is not None
             for n in nodes if id(n) not in nested)


def _raises(obj) -> bool:
  if inspect.isclass(obj):
    return False
  return any(isinstance(n, ast.Raise) and n.exc is not None for n in ast.walk(_body(obj)))


@pytest.mark.parametrize("name, obj", API, ids=[name for name, _ in API])
def test_each_public_definition_is_documented_google_style(name, obj):
  doc = inspect.getdoc(obj) or ""
  assert doc and doc.splitlines()[0].strip(), f"{name}: no summary line"
  sections = _sections(doc)
  is_exception = inspect.isclass(obj) and issubclass(obj, BaseException)
  parameters = [] if is_exception else _parameters(obj)
  if parameters:
    described = sections.get("Attributes" if dataclasses.is_dataclass(obj) else "Args", "")
    for parameter in parameters:
      assert re.search(rf"^\s+{parameter}\b.*:", described, re.M), \
          f"{name}: parameter {parameter!r} is not in its Args/Attributes"
  if _returns_a_value(obj):
    assert "Returns" in sections or "Yields" in sections, f"{name}: no Returns:"
  if _raises(obj):
    assert "Raises" in sections, f"{name}: raises, but has no Raises:"
  if name not in METHODS:  # A class's example shows its methods.
    assert EXAMPLE.search(doc), f"{name}: no fenced ```python example"


@pytest.mark.timeout(460)  # Past its runner's own 400 s bound.
def test_every_example_runs(tmp_path):
  # One process for all: 2 logical CPUs first (the examples that ask for them then find them),
  # each example in a namespace of its own, in a folder with the repository's configs (their
  # /tmp/tfdist directories moved into it). The parameter-server strategy's examples run last:
  # connecting to a cluster resets TensorFlow's context for the rest of the process.
  examples = [(name, match.group(1)) for name, obj in API
              for match in EXAMPLE.finditer(inspect.getdoc(obj) or "")]
  examples.sort(key=lambda example: "tfdist.parameter_server(" in example[1])
  for path in (REPO / "configs").glob("*.yaml"):
    (tmp_path / "configs").mkdir(exist_ok=True)
    (tmp_path / "configs" / path.name).write_text(
        path.read_text().replace("/tmp/tfdist", str(tmp_path / "tfdist")))
  (tmp_path / "examples.json").write_text(json.dumps(examples))
  runner = tmp_path / "run_examples.py"
  runner.write_text(textwrap.dedent("""
      import json, traceback
      import tfdist
      from tfdist.config.schema import DevicesConfig
      tfdist.configure_devices(DevicesConfig(logical_cpus=2))
      examples, failed = json.load(open("examples.json")), []
      for name, code in examples:
        try:
          exec(compile(code, name, "exec"), {"__name__": "__example__"})
        except BaseException:
          failed.append(name)
          print(f"FAILED {name}:\\n{traceback.format_exc()}", flush=True)
      print(f"{len(examples) - len(failed)} examples ran; failed: {failed}")
      """))
  env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO)}
  env.pop("TF_CONFIG", None)
  result = subprocess.run([sys.executable, str(runner)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=400)
  assert result.returncode == 0 and "failed: []" in result.stdout, \
      result.stdout[-6000:] + result.stderr[-3000:]
  assert len(examples) >= len([n for n, _ in API]) // 2
