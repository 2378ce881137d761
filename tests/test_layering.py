"""The house's one-way flow, checked: a room of tfdist imports only rooms below it (YAML ->
config -> strategy -> training -> callbacks; launcher -> plan -> processes; machine probes,
ports and errors beneath them all), so no import cycle can form between rooms."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / "tfdist"
LAYERS = (
    {"exit_codes"},
    {"errors", "progress", "machine"},
    {"config"},
    {"strategy", "parallel", "serving", "data_service"},
    {"monitoring"},
    {"training", "launch"},
    {"job_files", "testing", "launched"},
    {"cli"},
    {"tfdist", "__main__"},  # The package's own __init__ (the public API) and its entry point.
    {"examples", "script_hook"},  # A user's script, and what imports tfdist into one.
)
RANK = {room: rank for rank, rooms in enumerate(LAYERS) for room in rooms}


def _room(module: str) -> str:
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else "tfdist"


def _module(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports():
  for path in ROOT.rglob("*.py"):
    module = _module(path)
    for node in ast.walk(ast.parse(path.read_text())):
      names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
               [a.name for a in node.names] if isinstance(node, ast.Import) else [])
      for name in names:
        if name.startswith("tfdist.") or name == "tfdist":
          yield module, name


def test_every_room_is_in_a_layer():
  rooms = {_room(_module(path)) for path in ROOT.rglob("*.py")}
  assert rooms <= set(RANK), f"rooms without a layer: {sorted(rooms - set(RANK))}"


def test_rooms_import_only_rooms_below_them():
  upward = sorted(f"{module} imports {name}" for module, name in _imports()
                  if _room(module) != _room(name) and RANK[_room(name)] >= RANK[_room(module)])
  assert not upward, "\n".join(upward)


# Where a strategy's name may be written as a string: its declaration and its builder; the
# schema's default `strategy.name`; `__all__` names the factory functions (`tfdist.mirrored`),
# and Kubernetes calls its namespace "default".
_NAMES_ALLOWED = {"config/strategies.py", "strategy/factory.py"}
_OTHER_MEANINGS = {("config/schema.py", "name"), ("__init__.py", "__all__"),
                   ("job_files/kubernetes.py", "DEFAULT_NAMESPACE")}


def _docstrings(tree) -> set[int]:
  found = set()
  for node in ast.walk(tree):
    body = getattr(node, "body", None)
    if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
        isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
      found.add(id(body[0].value))
  return found


def _contexts(tree) -> dict[int, str]:
  """The name each constant is given to (by `id`): an assignment's target, a keyword or
  parameter; the first such holder in `ast.walk`'s order names it."""
  found = {}

  def give(nodes, name):
    for node in nodes:
      if isinstance(node, ast.Constant):
        found.setdefault(id(node), name)

  for node in ast.walk(tree):
    if isinstance(node, ast.Assign):
      give(ast.walk(node.value), getattr(node.targets[0], "id", ""))
    elif isinstance(node, ast.Call):
      first = node.args[0] if node.args else None
      give(node.args, first.value if isinstance(first, ast.Constant) else "")
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
      give([node.value], getattr(node.target, "id", ""))
    elif isinstance(node, ast.arguments):
      positional = node.args[len(node.args) - len(node.defaults):]
      for arg, default in [*zip(positional, node.defaults), *zip(node.kwonlyargs,
                                                                  node.kw_defaults)]:
        give([default] if default is not None else [], arg.arg)
  return found


def test_no_strategy_name_is_spelled_outside_its_declaration_and_builder():
  from tfdist.config import strategies
  names = set(strategies.names())
  spelled = []
  for path in ROOT.rglob("*.py"):
    relative = str(path.relative_to(ROOT))
    if relative in _NAMES_ALLOWED:
      continue
    tree = ast.parse(path.read_text())
    docs, contexts = _docstrings(tree), _contexts(tree)
    for node in ast.walk(tree):
      if isinstance(node, ast.Constant) and node.value in names and id(node) not in docs and \
          (relative, contexts.get(id(node), "")) not in _OTHER_MEANINGS:
        spelled.append(f"{relative}:{node.lineno}: {node.value!r}")
  assert not spelled, "\n".join(spelled)
