"""A `keras.utils.PyDataset` read as a `tf.data.Dataset` of its batches, the same on every worker.

Keras reads a PyDataset by index: `__getitem__(i)` gives batch i (the global batch),
`num_batches` (or `__len__`) how many there are, and `on_epoch_begin` / `on_epoch_end` frame each
pass (a user reshuffles there). Under multi_worker_mirrored every worker reads the whole batch and
keeps its replicas' share (auto-shard DATA), so every worker must read the same batch at the same
step: Keras's `shuffle=True` orders the batches with Python's global `random`, one order per
process; tfdist orders epoch e's batches by (training.seed, e) instead, as it orders arrays.

A pass's hooks run in the reading thread, around its reads: `on_epoch_begin` before its first
`__getitem__`, `on_epoch_end` after its last (before that batch is trained on), so a user's
reshuffle never races a read of the pass before it; and `on_epoch_end` where Keras's own loop
adds one (`EpochIterator.reset`): once before fit's first epoch, before every evaluate and
validation. A PyDataset that reshuffles itself there trains as on one device. `workers` > 1 reads that many batches at
once in threads, at most `max_queue_size` ahead; `use_multiprocessing` is refused.
"""

from __future__ import annotations

import collections
import itertools
import weakref
from concurrent import futures

import keras
import numpy as np
import tensorflow as tf
from keras.src.trainers.data_adapters import data_adapter_utils

from tfdist.errors import TfdistError


class PyDatasetError(TfdistError, ValueError):
  """A PyDataset tfdist cannot read as Keras would."""


def is_py_dataset(x) -> bool:
  return isinstance(x, keras.utils.PyDataset)


def batch_count(py_dataset: keras.utils.PyDataset, name: str = "x") -> int:
  """The number of batches of a pass, refusing an endless PyDataset in one line."""
  count = py_dataset.num_batches
  if count is None:
    raise PyDatasetError(f"{name}: a PyDataset without an end (num_batches=None) is not read "
                         "by tfdist: give it a length, or pass a Python generator with "
                         "steps_per_epoch. Received: num_batches=None")
  if count < 1:
    raise PyDatasetError(f"{name}: the PyDataset has no batch. Received: num_batches={count}")
  return int(count)


def batch_rows(py_dataset: keras.utils.PyDataset, name: str = "x") -> int:
  """The rows of the PyDataset's first batch: its global batch size."""
  return int(np.shape(tf.nest.flatten(_first_batches(py_dataset, name)[0])[0])[0])


_FIRST: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _first_batches(py_dataset, name: str) -> list:
  """The first batches, which Keras reads for the batches' signature (read once: a second read
  would be one Keras does not make)."""
  if py_dataset not in _FIRST:
    count = min(batch_count(py_dataset, name), data_adapter_utils.NUM_BATCHES_FOR_TENSOR_SPEC)
    _FIRST[py_dataset] = [_standardized(py_dataset[i], name) for i in range(count)]
  return _FIRST[py_dataset]


def dataset(py_dataset: keras.utils.PyDataset, *, method: str = "fit", shuffle: bool = False,
            seed: int = 0, first_epoch: int = 0, epochs: int | None = None,
            name: str = "x") -> tf.data.Dataset:
  """`py_dataset`'s batches as a `tf.data.Dataset`.

  Args:
    py_dataset: the user's `keras.utils.PyDataset` (or `keras.utils.Sequence`).
    method: the Keras method that reads it, for its hooks as Keras calls them (its
      `EpochIterator.reset` runs `on_epoch_end` before reading): "fit" (its training data:
      `on_epoch_end` once, before the first pass), "evaluate" (also fit's validation data:
      before every pass) or "predict" (never).
    shuffle: fit's epochs in the order of (seed, e) for epoch e; else in the PyDataset's own
      order (evaluate and predict always).
    seed: the shuffle's seed; every worker must use the same one.
    first_epoch: the epoch a resumed training starts at (fit).
    epochs: the epoch fit's stream ends before (None: endless).
    name: the argument's name, for errors.

  Returns:
    For fit, one stream of the passes of epochs `first_epoch` to `epochs` (read it by steps);
    for evaluate and predict, one pass each time it is read. A `tf.data.Dataset` of the
    PyDataset's batches (`(x,)`, `(x, y)`, `(x, y, sample_weight)`
    or a dict, as Keras's own adapter standardizes them), its length known when finite.

  Example:

  ```python
  class Batches(keras.utils.PyDataset):
    def __len__(self):
      return 4
    def __getitem__(self, i):
      return np.full((8, 3), i, "float32"), np.zeros((8, 1), "float32")

  batches = py_datasets.dataset(Batches())
  ```

  Raises:
    PyDatasetError: an endless PyDataset, one with no batch, or use_multiprocessing=True.
  """
  count = batch_count(py_dataset, name)
  if py_dataset.use_multiprocessing:
    raise PyDatasetError(f"{name}: tfdist reads a PyDataset's batches in threads (its "
                         "`workers`), not in processes: set use_multiprocessing=False. "
                         "Received: use_multiprocessing=True")
  signature = data_adapter_utils.get_tensor_spec(_first_batches(py_dataset, name))
  _FIRST.pop(py_dataset, None)
  if method not in _RESETS:
    raise ValueError(f"method: expected one of {sorted(_RESETS)}. Received: {method!r}")
  if method != "fit":  # One pass a read, in the PyDataset's order.
    passes, length = (lambda: [range(count)]), count
  else:  # One stream of the fit's epochs, read by steps: no pass beyond the last epoch's.
    py_dataset.on_epoch_end()

    def passes():
      numbers = itertools.count(first_epoch) if epochs is None else range(first_epoch, epochs)
      return (np.random.default_rng([seed, e]).permutation(count) if shuffle else range(count)
              for e in numbers)
    length = tf.data.INFINITE_CARDINALITY if epochs is None else \
        count * max(0, epochs - first_epoch)
  reset = method == "evaluate"
  return tf.data.Dataset.from_generator(
      lambda: _read(py_dataset, passes(), name, reset), output_signature=signature).apply(
          tf.data.experimental.assert_cardinality(length))


_RESETS = ("fit", "evaluate", "predict")


def _read(py_dataset, passes, name: str, reset: bool):
  """Each pass's batches, `on_epoch_begin` before its first read and `on_epoch_end` after its
  last (and before `on_epoch_begin` too where `reset`); `workers` > 1 of them read at once."""
  workers = max(1, int(py_dataset.workers))
  pool = futures.ThreadPoolExecutor(workers, "tfdist-pydataset") if workers > 1 else None
  ahead = max(workers, int(py_dataset.max_queue_size or 0))
  try:
    for order in passes:
      order = [int(i) for i in order]
      if reset:
        py_dataset.on_epoch_end()
      py_dataset.on_epoch_begin()
      for k, batch in enumerate(_in_order(py_dataset, order, pool, ahead)):
        batch = _standardized(batch, name)
        if k == len(order) - 1:
          py_dataset.on_epoch_end()
        yield batch
  finally:
    if pool:
      pool.shutdown(wait=True, cancel_futures=True)


def _in_order(py_dataset, order: list[int], pool, ahead: int):
  """`py_dataset[i]` for each i of `order`, in order: read here, or by `pool` at most `ahead`
  batches before they are wanted."""
  if pool is None:
    yield from (py_dataset[i] for i in order)
    return
  pending = collections.deque(pool.submit(py_dataset.__getitem__, i) for i in order[:ahead])
  for i in order[ahead:]:
    done = pending.popleft().result()
    pending.append(pool.submit(py_dataset.__getitem__, i))
    yield done
  while pending:
    yield pending.popleft().result()


def _standardized(batch, name: str):
  """A batch as Keras's PyDataset adapter standardizes it: `(x,)`, `(x, y)`, `(x, y, w)` or a
  dict."""
  if isinstance(batch, dict):
    return batch
  if isinstance(batch, np.ndarray):
    batch = (batch,)
  if isinstance(batch, list):
    batch = tuple(batch)
  if not isinstance(batch, tuple) or len(batch) not in (1, 2, 3):
    raise PyDatasetError(f"{name}: a PyDataset's __getitem__ must return (x,), (x, y), "
                         "(x, y, sample_weight) or a dict, as in Keras. Received: "
                         f"{type(batch).__name__}" + (f" of {len(batch)}" if isinstance(
                             batch, tuple) else ""))
  return batch
