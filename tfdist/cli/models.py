"""The model a command serves or exports, found on disk before TensorFlow is imported (so a
wrong path is one line on stderr, not a TensorFlow traceback): `tfdist model-server` and
`tfdist model-export` take the same MODEL argument."""

from __future__ import annotations

from tfdist.errors import ConfigError


def require_model(path: str) -> tuple[str, int]:
  """The model to load at `path` and its version: a `.keras` file or a SavedModel directory
  (version 1, or the directory's name when it is a number), or TensorFlow Serving's layout of
  numbered version directories (the newest).

  Raises:
    ConfigError: `path` is none of these.
  """
  import os
  if os.path.isfile(path) and path.endswith(".keras"):
    return path, 1
  if os.path.isfile(os.path.join(path, "saved_model.pb")):
    name = os.path.basename(os.path.normpath(path))
    return path, int(name) if name.isdigit() else 1
  versions = [int(v) for v in (os.listdir(path) if os.path.isdir(path) else ())
              if v.isdigit() and os.path.isfile(os.path.join(path, v, "saved_model.pb"))]
  if not versions:
    raise ConfigError("must be a .keras file, a SavedModel directory, or a directory of "
                      "numbered SavedModel versions (TensorFlow Serving's layout)", key="MODEL",
                      received=path)
  return os.path.join(path, str(max(versions))), max(versions)
