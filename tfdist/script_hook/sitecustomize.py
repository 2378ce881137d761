"""Run at start-up by every Python process that `tfdist launch` starts for the user's command
(the launcher puts this folder first on its PYTHONPATH): a script that never imports tfdist,
written as TensorFlow's multi-worker tutorial or Keras's distributed-training guide teaches (its
own `MultiWorkerMirroredStrategy()`, Keras's own `model.fit`), gets what `import tfdist` gives a
launched task -- the config's devices and strategy made first, and tfdist's Keras 3 fixes around
Keras's own fit, evaluate and predict -- unchanged.

`import tfdist` runs once `tensorflow` or `keras` has finished importing, whichever comes first
without the other half-imported (a script that imports keras first imports TensorFlow inside
it). A `sitecustomize` found further on the path runs too, as without tfdist.
"""

import faulthandler
import importlib.abc
import importlib.util
import os
import sys

_WATCHED = ("tensorflow", "keras")


def _half_imported(name: str) -> bool:
  module = sys.modules.get(name)
  return module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False)


class _ThenTfdist(importlib.abc.MetaPathFinder):
  """Imports tfdist after the first of `_WATCHED` to finish importing."""

  def find_spec(self, name, path=None, target=None):
    if name not in _WATCHED:
      return None
    for finder in sys.meta_path:
      if finder is self or not hasattr(finder, "find_spec"):
        continue
      spec = finder.find_spec(name, path, target)
      if spec is not None and spec.loader is not None:
        spec.loader = _Loader(spec.loader)
        return spec
    return None


class _Loader(importlib.abc.Loader):
  def __init__(self, loader):
    self._loader = loader

  def __getattr__(self, name):  # get_code, is_package, resource readers: the real loader's.
    return getattr(self._loader, name)

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    self._loader.exec_module(module)
    others = [n for n in _WATCHED if n != module.__name__]
    if "tfdist" in sys.modules or any(_half_imported(n) for n in others):
      return
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _ThenTfdist)]
    import tfdist  # noqa: F401  The task's strategy, devices and Keras fixes.


def _run_next_sitecustomize() -> None:
  here = os.path.dirname(os.path.abspath(__file__))
  for folder in sys.path:
    candidate = os.path.join(folder or ".", "sitecustomize.py")
    if os.path.abspath(folder or ".") != here and os.path.isfile(candidate):
      spec = importlib.util.spec_from_file_location("_next_sitecustomize", candidate)
      spec.loader.exec_module(importlib.util.module_from_spec(spec))
      return


if os.environ.get("TFDIST_PREPARE") == "1":
  faulthandler.enable(all_threads=True)  # A task dying of a signal leaves its Python stack.
  sys.meta_path.insert(0, _ThenTfdist())
_run_next_sitecustomize()
