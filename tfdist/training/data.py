"""Training data in, a dataset of global batches that every strategy shards correctly out.

- numpy arrays: batched by the global batch size; each replica takes its share of every batch
  (auto-shard policy DATA), so a step sees the same examples as on one device.
- a `tf.data.Dataset`: kept as the caller built it (batched with the global batch, as Keras
  expects); the shard policy is FILE when it reads files (each worker reads its own files),
  else DATA, so in-memory data gives no auto-shard warning.
- a function of `tf.distribute.InputContext`: called once per worker through
  `strategy.distribute_datasets_from_function`; it shards and batches itself.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import tensorflow as tf

from tfdist.errors import TfdistError

_FILE_READERS = {b"TFRecordDataset", b"TFRecordDatasetV2", b"TextLineDataset",
                 b"TextLineDatasetV2", b"FixedLengthRecordDataset",
                 b"FixedLengthRecordDatasetV2"}
_DEFAULT_SHUFFLE_SEED = 0


class DataError(TfdistError, ValueError):
  """Training data of a kind or shape tfdist cannot feed."""


def is_dataset_fn(data: Any) -> bool:
  return callable(data) and not isinstance(data, tf.data.Dataset) and \
      len(inspect.signature(data).parameters) == 1


def make_dataset(x, y=None, *, strategy, batch_size: int | None, shuffle: bool = False,
                 seed: int | None = None, first_epoch: int = 0, epochs: int | None = None,
                 name: str = "x"):
  """Returns what Keras's fit/evaluate/predict should receive for `x` (and `y`).

  Args:
    x: numpy arrays (or a tuple/dict of them), a `tf.data.Dataset`, or a dataset function.
    y: targets when `x` is numpy.
    strategy: the strategy the data is for.
    batch_size: the global batch size for numpy inputs.
    shuffle: shuffle numpy inputs each epoch. The order of epoch e depends on (seed, e) only:
      the same on every worker and after a restart. The result is then a stream of the epochs
      `first_epoch` to `epochs` (endless when None), each ending in its partial batch: fit it
      with `steps_per_epoch=batch_count(x, batch_size)`.
    seed: the shuffle seed; every worker must use the same one.
    first_epoch: the epoch a resumed training starts at.
    epochs: the epoch training ends before.
    name: the argument's name, for errors.

  Raises:
    DataError: the input is of no supported kind, or numpy input has no batch size.
  """
  if x is None:
    return None
  if is_dataset_fn(x):
    return strategy.distribute_datasets_from_function(x)
  if isinstance(x, tf.distribute.DistributedDataset):
    return x
  if isinstance(x, tf.data.Dataset):
    if y is not None:
      raise DataError(f"{name}: a tf.data.Dataset carries its own targets; pass y=None. "
                      f"Received: y of type {type(y).__name__}")
    return _with_shard_policy(x)
  if is_arrays(x):
    require_batch_size(batch_size, name)
    arrays = x if y is None else (x, y)
    if shuffle:
      dataset = _shuffled_epochs(arrays, batch_size, _DEFAULT_SHUFFLE_SEED if seed is None
                                 else seed, first_epoch, epochs)
    else:
      dataset = tf.data.Dataset.from_tensor_slices(arrays).batch(batch_size)
    dataset = dataset.prefetch(tf.data.AUTOTUNE)
    return _with_policy(dataset, tf.data.experimental.AutoShardPolicy.DATA)
  raise DataError(f"{name}: must be numpy arrays, a tf.data.Dataset, or a function of a "
                  f"tf.distribute.InputContext. Received: {type(x).__name__}")


def require_batch_size(batch_size: int | None, name: str) -> None:
  """Raises DataError when numpy input `name` has no batch size."""
  if not batch_size:
    raise DataError(f"{name}: numpy input needs a batch size: set training.global_batch_size "
                    "or per_replica_batch_size in the config, or pass batch_size. "
                    "Received: batch_size=None")


def batch_count(x, batch_size: int) -> int:
  """Batches in one epoch of numpy input `x`, the last one partial."""
  return -(-len(tf.nest.flatten(x)[0]) // batch_size)


def _shuffled_epochs(arrays, batch_size: int, seed: int, first_epoch: int, epochs: int | None):
  count = len(tf.nest.flatten(arrays)[0])
  tensors = tf.nest.map_structure(tf.convert_to_tensor, arrays)

  def epoch(e):
    order = tf.random.experimental.stateless_shuffle(tf.range(count, dtype=tf.int64),
                                                     seed=tf.stack([tf.constant(seed, tf.int64), e]))
    return tf.data.Dataset.from_tensor_slices(order).batch(batch_size)

  numbers = (tf.data.Dataset.range(first_epoch, epochs) if epochs is not None
             else tf.data.Dataset.counter(first_epoch))
  return numbers.flat_map(epoch).map(
      lambda indices: tf.nest.map_structure(lambda t: tf.gather(t, indices), tensors),
      num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def is_arrays(x) -> bool:
  leaves = tf.nest.flatten(x)
  return bool(leaves) and all(isinstance(v, (np.ndarray, list)) or tf.is_tensor(v)
                              for v in leaves)


def _with_shard_policy(dataset: tf.data.Dataset) -> tf.data.Dataset:
  if dataset.options().experimental_distribute.auto_shard_policy != \
      tf.data.experimental.AutoShardPolicy.AUTO:
    return dataset  # The caller chose.
  policy = (tf.data.experimental.AutoShardPolicy.FILE if reads_files(dataset)
            else tf.data.experimental.AutoShardPolicy.DATA)
  return _with_policy(dataset, policy)


def reads_files(dataset: tf.data.Dataset) -> bool:
  """True when the dataset's graph has a file reader (TFRecord, text line, fixed length)."""
  graph = tf.compat.v1.GraphDef()
  graph.ParseFromString(dataset._as_serialized_graph().numpy())
  ops = {node.op.encode() for node in graph.node}
  ops |= {node.op.encode() for f in graph.library.function for node in f.node_def}
  return bool(ops & _FILE_READERS)


def _with_policy(dataset: tf.data.Dataset, policy) -> tf.data.Dataset:
  options = tf.data.Options()
  options.experimental_distribute.auto_shard_policy = policy
  return dataset.with_options(options)
