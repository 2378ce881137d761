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
    {"strategy", "parallel", "serving"},
    {"monitoring"},
    {"training", "launch"},
    {"job_files", "testing"},
    {"cli"},
    {"tfdist", "__main__"},  # The package's own __init__ (the public API) and its entry point.
    {"examples"},  # A user's script: it imports the public API.
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
