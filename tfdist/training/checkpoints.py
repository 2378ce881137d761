"""Chief-aware files: a backup per task to resume a restarted cluster, per-epoch checkpoints
and the final model written by the chief alone.

Layout of `checkpoint.dir`:

  backup/<task>-<index>/   Keras BackupAndRestore state of each task (weights, optimizer,
                           epoch, and the step within it after a preemption); removed when
                           training finishes.
  epoch-0003.weights.h5    the chief's checkpoints, the newest `max_to_keep` kept.
  model.keras              the chief's final model.

Every task writes (saving may need every worker's participation under MultiWorkerMirrored),
but only the chief writes into `checkpoint.dir`; the others write into a temporary directory
removed right after.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import json
import os
import pathlib
import shutil
import tempfile
import time

import keras
import numpy as np

from tfdist.config.loader import RUN_ENV
from tfdist.config.roles import is_chief, task_name
from tfdist.config.schema import Config
from tfdist.machine import children
from tfdist.training import backup_cadence, report

FINAL_MODEL = "model.keras"
EPOCH_CHECKPOINT = "epoch-{epoch:04d}.weights.h5"


@contextlib.contextmanager
def writable_dir(config: Config, directory: str):
  """`directory` on the chief; elsewhere a temporary directory, removed on exit."""
  if is_chief(config):
    os.makedirs(directory, exist_ok=True)
    yield directory
    return
  with scratch_dir(config) as scratch:
    yield scratch


@contextlib.contextmanager
def scratch_dir(config: Config):
  """A temporary directory of this task's (`tfdist-<task>-<pid>-...`), removed on exit: where a
  non-chief task's copies of the chief's files go. A task killed before its exit (SIGKILL, a
  restart) leaves its directory behind; the next one of the same task removes those whose
  process is gone."""
  prefix = f"tfdist-{task_name(config)}-"
  _remove_orphans(prefix)
  run = os.environ.get(RUN_ENV, "local").replace(os.sep, "_")  # Keyed by the launch's run.
  scratch = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-{run}-")
  try:
    yield scratch
  finally:
    shutil.rmtree(scratch, ignore_errors=True)


def _remove_orphans(prefix: str) -> None:
  root = tempfile.gettempdir()
  for name in os.listdir(root):
    pid = name[len(prefix):].split("-", 1)[0]
    if name.startswith(prefix) and pid.isdigit() and not children.alive(int(pid)):
      shutil.rmtree(os.path.join(root, name), ignore_errors=True)


class Backup(keras.callbacks.BackupAndRestore):
  """Keras's BackupAndRestore in a directory of this task's own: one directory shared by the
  workers races (FileExistsError at the first epoch end, an h5 lock after a restart)."""

  def __init__(self, config: Config, fresh: bool = False):
    self.directory = os.path.join(config.checkpoint.dir, "backup", task_name(config))
    if fresh:
      shutil.rmtree(self.directory, ignore_errors=True)
    super().__init__(backup_dir=self.directory, save_freq="epoch", delete_checkpoint=True,
                     double_checkpoint=True)
    self.cadence = backup_cadence.Cadence(config.checkpoint.backup_every_steps,
                                          config.checkpoint.backup_budget)
    self._chief = is_chief(config)
    self._epoch_steps: int | None = None  # Unknown: backups at epoch ends only.
    self._first_step = 0  # Steps of the resumed epoch done before this fit.
    self._epoch = 0
    self._done = 0  # Steps done in the epoch at the last call's end.
    self._writing: concurrent.futures.Future | None = None
    if not fresh:
      self._adopt_newest()

  def within_epochs(self, epoch_steps: int | None, first_step: int = 0,
                    cadence: backup_cadence.Cadence | None = None) -> None:
    """Backs up every `checkpoint.backup_every_steps` steps within epochs of `epoch_steps`
    steps (None: their length is unknown, backups at epoch ends only), the first epoch resumed
    `first_step` steps into it, within `checkpoint.backup_budget`: `cadence` is the run's
    (`settings.backup_cadence`: every worker votes), else this process's own."""
    self._epoch_steps, self._first_step = epoch_steps, first_step
    self.cadence = cadence or self.cadence

  def _adopt_newest(self) -> None:
    """Takes the newest of every task's backups when it is newer than this task's own: a
    worker back in an elastic cluster (or renumbered) resumes where the cluster is, not where
    it left. Synchronous replicas save the same state at the same step (tfdist's preemption
    agreement, the epoch's end), so any task's newest backup is this task's."""
    parent = os.path.dirname(self.directory)
    with contextlib.suppress(OSError):
      others = [os.path.join(parent, name) for name in os.listdir(parent)]
      newest = max(others, key=_saved_position, default=self.directory)
      if _saved_position(newest) > _saved_position(self.directory):
        os.makedirs(self.directory, exist_ok=True)
        for path in (self._weights_path, self._training_metadata_path):
          shutil.copyfile(os.path.join(newest, os.path.basename(path)), path + ".adopting")
          os.replace(path + ".adopting", path)

  def saved_position(self) -> tuple[int, int]:
    """The epoch and the steps done in it that training resumes at ((0, 0): no backup); the
    steps are 0 unless a preemption saved the backup within an epoch."""
    return max(_saved_position(self.directory), (0, 0))

  def save_position(self, epoch: int, step: int) -> None:
    """Saves the backup `step` steps into `epoch` (a preemption's save, between two calls)."""
    self._current_epoch, self._last_batch_seen = epoch, step
    self._save_model()

  def position(self, batch: int, steps: int | None) -> tuple[int, int]:
    """Where training stands once call `batch` of this fit's epoch ended: (epoch, steps done
    in it), the resumed epoch's steps before this fit counted; after an epoch's last call
    (`steps`: this fit's steps per epoch, None unknown), the next epoch's start. The one count
    of steps the backups and the preemption save share."""
    done = self._steps_done(batch)
    if steps and done >= steps + self._first_step:
      return self._epoch + 1, 0
    return self._epoch, done

  def _steps_done(self, batch: int) -> int:
    """Steps done in the epoch once this fit's call `batch` ended."""
    return batch + 1 + self._first_step

  def on_epoch_begin(self, epoch, logs=None):
    self._epoch, self._done = epoch, self._first_step

  def on_train_batch_end(self, batch, logs=None):
    """A backup in the background when this call crossed a multiple of `backup_every_steps`
    (the epoch's last call excepted: the epoch's end saves)."""
    done, before = self._steps_done(batch), self._done
    self._done = done
    if not self._epoch_steps or done >= self._epoch_steps:
      return
    if self.cadence.due(before, done):
      self._current_epoch, self._last_batch_seen = self._epoch, done
      self._save_model(background=True)
    elif self._chief:
      report.say(self.cadence.skip_line(f"epoch {self._epoch + 1}, step {done}"))

  def on_epoch_end(self, epoch, logs=None):
    self._first_step = 0  # Only the resumed epoch started part-way.
    super().on_epoch_end(epoch, logs)

  def _save_model(self, background: bool = False):
    """Keras's save, from a copy: every variable copied here, at this step, then written
    (as `save_weights` writes) by one background thread, aside and renamed into place (the
    weights first). A save in the background lets the steps go on; the next save waits for
    it, so a backup is never older than one interval. A save that fails half-way (a chief
    whose parameter server died while it read the variables; a process killed while it
    writes) leaves the previous backup whole. Keras writes in place and falls back to its copy
    (`double_checkpoint`) only on an OSError, but a half-written .h5 fails to load with a
    ValueError (keras-team/keras#20463, #20465)."""
    self.wait()
    began = self.cadence.begin()
    copy = weights_copy(self.model)
    position = {"epoch": self._current_epoch, "batch": self._last_batch_seen}
    self._writing = _writer().submit(self._timed_write, copy, position)
    self.cadence.waited(began)
    if not background:
      self.wait()

  def wait(self) -> None:
    """Until the backup being written is in place (its error raised here)."""
    if self._writing is not None:
      writing, self._writing = self._writing, None
      writing.result()

  def _timed_write(self, copy: dict, position: dict) -> None:
    began = time.monotonic()
    self._write(copy, position)
    self.cadence.wrote(time.monotonic() - began)

  def _write(self, copy: dict, position: dict) -> None:
    os.makedirs(self.backup_dir, exist_ok=True)
    writing = os.path.join(self.backup_dir, ".writing.weights.h5")
    write_weights(copy, writing)
    metadata = os.path.join(self.backup_dir, ".writing-training_metadata.json")
    pathlib.Path(metadata).write_text(json.dumps(position))
    for path, previous in ((self._weights_path, self._prev_weights_path),
                           (self._training_metadata_path, self._prev_training_metadata_path)):
      if self.double_checkpoint and os.path.exists(path):
        shutil.copyfile(path, previous)
    os.replace(writing, self._weights_path)
    os.replace(metadata, self._training_metadata_path)

  def on_train_end(self, logs=None):
    self.wait()
    super().on_train_end(logs)
    with contextlib.suppress(OSError):  # The parent, once every task's backup is gone.
      os.rmdir(os.path.dirname(self.directory))


@functools.cache
def _writer() -> concurrent.futures.ThreadPoolExecutor:
  """The process's one thread writing backups (made at the first): every fit's `Backup` shares
  it, so a process running many fits does not keep an idle thread for each."""
  return concurrent.futures.ThreadPoolExecutor(1, "tfdist-backup")


def weights_copy(model) -> dict:
  """A copy of every variable `model.save_weights` writes, by its path in the file: Keras's own
  walk of the model's state (`saving_lib.save_weights_only`, into a store that copies instead
  of writing; Keras has no public save to memory). `write_weights` writes the file."""
  from keras.src.saving import saving_lib

  class Copy(saving_lib.H5IOStore):  # `_save_state` takes Keras's stores alone.
    def __init__(self):  # pylint: disable=super-init-not-called
      self.mode, self.entries, self._entry = "w", {}, {}

    def __bool__(self):
      return True

    def make(self, path, metadata=None):
      self._entry = self.entries.setdefault(path, (metadata, {}))[1]
      return self

    def __setitem__(self, key, value):
      array = keras.ops.convert_to_numpy(value)  # TensorFlow's: a copy of the variable's.
      # A view, or an array handed through, would change with the next step: copy it then.
      self._entry[key] = array if array is not value and array.flags.owndata else \
          np.array(array, copy=True)

  copy = Copy()
  saving_lib._save_state(model, weights_store=copy, assets_store=None, inner_path="",
                         visited_saveables=set())
  return copy.entries


def write_weights(copy: dict, path: str) -> None:
  """Writes `weights_copy`'s copy as the `.weights.h5` file `model.save_weights` would."""
  from keras.src.saving import saving_lib
  store = saving_lib.H5IOStore(path, mode="w")
  try:
    for entry, (metadata, values) in copy.items():
      store.make(entry, metadata=metadata)
      for key, value in values.items():
        store[key] = value
  finally:
    store.close()


def _saved_position(directory: str) -> tuple[int, int]:
  """(epoch, steps into it) of the backup in `directory`; (-1, -1) without one."""
  for name in ("training_metadata.json", "training_metadata.json.bkp"):
    with contextlib.suppress(OSError, ValueError, KeyError):
      saved = json.loads(pathlib.Path(directory, name).read_text())
      return int(saved["epoch"]), int(saved.get("batch") or 0)
  return -1, -1


class EpochCheckpoint(keras.callbacks.Callback):
  """Saves the weights at every epoch end: the chief into `checkpoint.dir`, keeping the newest
  `max_to_keep`; other tasks into a temporary directory that is removed at once."""

  def __init__(self, config: Config):
    super().__init__()
    self.config = config

  def on_epoch_end(self, epoch, logs=None):
    with writable_dir(self.config, self.config.checkpoint.dir) as directory:
      name = EPOCH_CHECKPOINT.format(epoch=epoch + 1)
      # Written aside, then renamed: an evaluator never reads a half-written checkpoint.
      self.model.save_weights(os.path.join(directory, f".writing-{name}"))
      os.replace(os.path.join(directory, f".writing-{name}"), os.path.join(directory, name))
      if directory == self.config.checkpoint.dir:
        _keep_newest(directory, self.config.checkpoint.max_to_keep)


def _keep_newest(directory: str, count: int) -> None:
  saved = sorted(pathlib.Path(directory).glob(EPOCH_CHECKPOINT.replace("{epoch:04d}", "*")))
  for old in saved[:-count]:
    old.unlink()


def save_final_model(model, config: Config) -> str | None:
  """Saves `model` as `checkpoint.dir/model.keras` on the chief; returns that path there."""
  with writable_dir(config, config.checkpoint.dir) as directory:
    path = os.path.join(directory, FINAL_MODEL)
    model.save(path)
  return path if is_chief(config) else None


def callbacks(config: Config, fresh: bool = False) -> list:
  """The file callbacks the config asks for: backup first (it restores before the others run).
  `fresh` removes this task's backup first: training starts over."""
  if not config.checkpoint.dir:
    return []
  return [Backup(config, fresh), EpochCheckpoint(config)]
