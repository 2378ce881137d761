"""The user's own files written once, by the chief: their Keras callbacks, `model.save`, and a
script's own `tf.train.Checkpoint.save`.

Every worker of a synchronous cluster runs the same script, so each one's `ModelCheckpoint`,
`CSVLogger`, `TensorBoard` and `model.save` write the same path at once (two MultiWorkerMirrored
workers' `model.save` measured: `BadZipFile: Bad CRC-32`). As tf.keras 2 did for its callbacks,
tfdist points the other workers' copies at temporary directories, removed when training ends
(the saving itself still runs everywhere: a save may need every worker's participation).
`BackupAndRestore` is the exception: every task needs its own backup to resume, so the others
get a directory of their own beside the chief's.

```python
history = tfdist.fit(make_model, dataset, config=config,
                     callbacks=[keras.callbacks.ModelCheckpoint("ckpt/{epoch}.keras")])
history.model.save("model.keras")   # one file, the chief's
```
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Iterator, Sequence

import keras

from tfdist.config.roles import is_chief, task_name
from tfdist.config.schema import Config
from tfdist.training.checkpoints import scratch_dir


_WRITES = {keras.callbacks.BackupAndRestore: "backup_dir",
           keras.callbacks.ModelCheckpoint: "filepath", keras.callbacks.CSVLogger: "filename",
           keras.callbacks.TensorBoard: "log_dir"}
"""Keras's callbacks that write files, and the attribute saying where."""


@contextlib.contextmanager
def chief_only(callbacks: Sequence, config: Config, resuming: bool = False) -> Iterator[list]:
  """Yields the callbacks to train with: on the chief `callbacks` as given; on other tasks the
  same callbacks writing to a temporary directory, removed on exit. When the run resumes
  (`resuming`: tfdist's backup, or the user's own BackupAndRestore has one), the user's
  CSVLogger appends: Keras's default `append=False` would truncate the epochs already logged."""
  if resuming or any(_has_backup(c) for c in callbacks):
    for callback in callbacks:
      if isinstance(callback, keras.callbacks.CSVLogger):
        callback.append = True
  if is_chief(config) or not any(isinstance(c, tuple(_WRITES)) for c in callbacks):
    yield list(callbacks)
    return
  given = [(c, _where(c)) for c in callbacks]
  try:
    with scratch_dir(config) as scratch:
      yield [_redirected(c, scratch, task_name(config)) for c in callbacks]
  finally:  # The user's callbacks as given, for their next fit.
    for callback, where in given:
      _write_to(callback, where)


def _has_backup(callback) -> bool:
  return isinstance(callback, keras.callbacks.BackupAndRestore) and (
      os.path.exists(callback._training_metadata_path) or
      os.path.exists(callback._prev_training_metadata_path))


def save_on_chief_only(model, config: Config) -> None:
  """Makes `model.save` and `model.save_weights` of a non-chief task write to a temporary
  directory that is removed at once; on the chief they are unchanged."""
  if is_chief(config):
    return
  for name in ("save", "save_weights"):
    method = getattr(model, name)
    setattr(model, name, functools.partial(_save_aside, method, config))


def checkpoints_on_chief_only(config: Config) -> None:
  """Makes a script's own `tf.train.Checkpoint(...).save(prefix)` of a non-chief task write to a
  temporary directory that is removed at once, as tf-keras's distributed_file_utils does for its
  own files (two MultiWorkerMirrored workers saving one prefix measured: "..._temp/
  part-00000-of-00001 did not exist"); the save itself runs everywhere. Process-wide, for the
  class's public `save` (a CheckpointManager writes through its own path, unchanged); nothing
  on the chief."""
  import tensorflow as tf
  if is_chief(config) or getattr(tf.train.Checkpoint.save, "tfdist_aside", False):
    return
  tf_save = tf.train.Checkpoint.save

  @functools.wraps(tf_save)
  def save(checkpoint, file_prefix, *args, **kwargs):
    with scratch_dir(config) as scratch:
      return tf_save(checkpoint, _inside(scratch, file_prefix), *args, **kwargs)
  save.tfdist_aside = True
  tf.train.Checkpoint.save = save


def _save_aside(method, config: Config, filepath, *args, **kwargs):
  with scratch_dir(config) as scratch:
    return method(os.path.join(scratch, os.path.basename(os.fspath(filepath))), *args, **kwargs)


def _where(callback):
  return next((getattr(callback, attribute) for kind, attribute in _WRITES.items()
               if isinstance(callback, kind)), None)


def _redirected(callback, scratch: str, task_name: str):
  """The callback writing into `scratch` (or, for a backup, into a directory of its task's own)."""
  where = _where(callback)
  if isinstance(callback, keras.callbacks.BackupAndRestore):
    _write_to(callback, f"{os.fspath(where).rstrip(os.sep)}-{task_name}")
  elif where is not None:
    _write_to(callback, _inside(scratch, where))
  return callback


def _write_to(callback, path) -> None:
  """Makes `callback` (one of `_WRITES`) write at `path`."""
  if isinstance(callback, keras.callbacks.BackupAndRestore):  # Its paths derive from it.
    callback.__init__(path, save_freq=callback.save_freq,
                      double_checkpoint=callback.double_checkpoint,
                      delete_checkpoint=callback.delete_checkpoint)
  elif path is not None:
    setattr(callback, next(a for k, a in _WRITES.items() if isinstance(callback, k)), path)


def _inside(scratch: str, path) -> str:
  """`path` moved under `scratch`, keeping its relative layout (format fields included)."""
  moved = os.path.join(scratch, os.path.relpath(os.path.abspath(os.fspath(path)), os.sep))
  os.makedirs(os.path.dirname(moved), exist_ok=True)  # As the chief's own directory exists.
  return moved
