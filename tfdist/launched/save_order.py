"""A worker's read of a file ordered after the chief's save of it, in a launched cluster of
synchronous workers.

TensorFlow's "Multi-worker training with Keras" tutorial has every worker save (the chief to
the real path, the others to a temporary one, `write_filepath`) and then every worker load the
chief's file, as its checkpoint section does with `CheckpointManager.save` and
`tf.train.latest_checkpoint`. Keras 3's `model.save` is no collective: nothing ordered another
worker's read after the chief's write (`load_model` failed on worker 1 with "File not found" in
3 launches of 4, and a file left by an earlier run would have been read silently).

Each worker counts its saves; after its k-th the chief publishes k in TensorFlow's coordination
service, and a read on another worker that has made k saves first waits for the chief's k-th:
the worker's own k-th was the page's save aside, the chief's k-th the real one. Every worker
saving, as the tutorial has it, is what orders a read: a worker that saves nothing itself
(`if is_chief: model.save(...)`) reads at once, and a read that waits 10 s says so.

Saves counted: Keras's `model.save`, `save_weights` (`keras.saving.save_model`), TensorFlow's
`Checkpoint.save`, `write` and `CheckpointManager.save`. Reads ordered: Keras's `load_model`,
`load_weights`, TensorFlow's `tf.train.latest_checkpoint`, `Checkpoint.restore` and `read`.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time

from tfdist.config.roles import is_chief, task_name
from tfdist.config.schema import Config
from tfdist.errors import TfdistError

WAIT_S = 600.0  # As tfdist's exit barrier: a chief's save of a large model, on a slow disk.
SAID_AFTER_S = 10.0
_KEY = "tfdist/saves/{count}"


class SaveOrder:
  """This worker's saves, and the wait a read makes for the chief's save of the same count.

  Args:
    chief: whether this worker is the chief (it publishes its saves, and never waits).
    name: this task's name, for the line a long wait says.
    store: TensorFlow's coordination-service context (`set_config_key_value`,
      `get_config_key_value`).
  """

  def __init__(self, chief: bool, name: str, store):
    import tensorflow as tf
    self.chief, self.name, self.store = chief, name, store
    self.timed_out = tf.errors.DeadlineExceededError
    self.saves = 0
    self._depth = threading.local()

  def around_save(self, save):
    """`save` counted once (nested saves inside it are one), the count published by the
    chief once it returned."""
    @functools.wraps(save)
    def counted(*args, **kwargs):
      if self._inside("saving"):
        return save(*args, **kwargs)
      with self._within("saving"):
        result = save(*args, **kwargs)
      self.saves += 1
      if self.chief:
        self.store.set_config_key_value(_KEY.format(count=self.saves), self.name)
      return result
    counted.tfdist_save_order = True
    return counted

  def around_read(self, read, what: str, path_at: int):
    """`read` after the chief's save of this worker's count (once, nested reads inside); its
    argument `path_at` is the path it reads, for the line a long wait says."""
    @functools.wraps(read)
    def ordered(*args, **kwargs):
      if not self._inside("reading"):
        self.wait(what, args[path_at] if len(args) > path_at else "")
      with self._within("reading"):
        return read(*args, **kwargs)
    ordered.tfdist_save_order = True
    return ordered

  def wait(self, what: str, target) -> None:
    """Waits, at most `WAIT_S`, until the chief published as many saves as this worker made.

    Raises:
      TfdistError: the chief made fewer saves within `WAIT_S`.
    """
    if self.chief or not self.saves:
      return
    began, said = time.monotonic(), False
    key = _KEY.format(count=self.saves)
    while True:
      try:
        self.store.get_config_key_value(key, timeout_in_ms=int(SAID_AFTER_S * 1000))
        return
      except self.timed_out:
        pass
      waited = time.monotonic() - began
      if waited >= WAIT_S:
        raise TfdistError(
            f"{self.name}'s {what} of {target!r} waited {waited:.0f} s for the chief's save "
            f"number {self.saves}, which never came: tfdist orders a worker's read after the "
            "chief's save of the same count, and this worker saved more often than the chief")
      if not said:
        print(f"tfdist: {self.name}'s {what} of {target!r} waits for the chief's save number "
              f"{self.saves} (a worker reads after the chief's save of its count)",
              file=sys.stderr, flush=True)
        said = True

  def _inside(self, kind: str) -> bool:
    return getattr(self._depth, kind, 0) > 0

  @contextlib.contextmanager
  def _within(self, kind: str):
    setattr(self._depth, kind, getattr(self._depth, kind, 0) + 1)
    try:
      yield
    finally:
      setattr(self._depth, kind, getattr(self._depth, kind) - 1)


def install(config: Config) -> SaveOrder | None:
  """Counts this worker's saves and orders its reads (above), in a task of a launched cluster
  of several synchronous workers; elsewhere does nothing. Idempotent.

  Args:
    config: the launched task's config.

  Returns:
    The `SaveOrder` installed, or None.

  Example:

  ```python
  save_order.install(tfdist.load_config())
  model.save(write_filepath(path, task_type, task_id))   # every worker: counted
  keras.models.load_model(path)     # a worker: after the chief's save of the same count
  ```
  """
  from tfdist.config import strategies
  kind = strategies.kind(config.strategy.name)
  if not kind.all_reduces_across_workers or config.cluster.training_tasks < 2:
    return None
  import tensorflow as tf
  from keras.src.saving import saving_api
  from tensorflow.python.checkpoint import checkpoint_management
  from tensorflow.python.eager import context
  if getattr(saving_api.save_model, "tfdist_save_order", False):
    return None
  order = SaveOrder(is_chief(config), task_name(config), context.context())
  for name in ("save_model", "save_weights"):
    _rebind(saving_api, name, order.around_save(getattr(saving_api, name)))
  for name in ("save", "write"):
    setattr(tf.train.Checkpoint, name, order.around_save(getattr(tf.train.Checkpoint, name)))
  tf.train.CheckpointManager.save = order.around_save(tf.train.CheckpointManager.save)
  for name, path_at in (("load_model", 0), ("load_weights", 1)):
    _rebind(saving_api, name, order.around_read(getattr(saving_api, name), name, path_at))
  _rebind(checkpoint_management, "latest_checkpoint", order.around_read(
      checkpoint_management.latest_checkpoint, "tf.train.latest_checkpoint", 0))
  for name in ("restore", "read"):
    setattr(tf.train.Checkpoint, name, order.around_read(
        getattr(tf.train.Checkpoint, name), f"Checkpoint.{name}", 1))
  return order


def _rebind(module, name: str, wrapped) -> None:
  """`module.name` replaced by `wrapped`, and so is every other module's binding of the same
  function imported before (`keras.models.load_model`, `tf.train.latest_checkpoint`); a
  module importing it later takes the new one."""
  original = getattr(module, name)
  setattr(module, name, wrapped)
  for other in list(sys.modules.values()):
    if getattr(other, "__dict__", {}).get(name) is original:
      setattr(other, name, wrapped)
