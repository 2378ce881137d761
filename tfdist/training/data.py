"""Training data in, a dataset of global batches that every strategy shards correctly out.

- numpy arrays: batched by the global batch size; each replica takes its share of every batch
  (auto-shard policy DATA), so a step sees the same examples as on one device.
- a `tf.data.Dataset`: kept as the caller built it (batched with the global batch, as Keras
  expects); the shard policy is FILE when it reads files (each worker reads its own files),
  else DATA, so in-memory data gives no auto-shard warning.
- a function of `tf.distribute.InputContext`: called once per worker through
  `strategy.distribute_datasets_from_function`; it shards and batches itself.
- a Python generator of global batches: read through `tf.data.Dataset.from_generator`, its
  signature taken from the first batch.
- a `keras.utils.PyDataset` of global batches: read by index (`py_datasets`), shuffled in
  tfdist's seeded order of its batches.

A dataset batched by another size than the config's global batch is refused, as is numpy input
whose last batch would leave a replica with no examples (TensorFlow's convolution gradients fail
on an empty batch: its last examples, fewer than the replicas, are dropped, and tfdist says so).
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfdist.progress as progress
from tfdist.training import py_datasets
from tfdist.errors import DataError  # noqa: F401  Its home; raised and imported from here too.

_FILE_READERS = {b"TFRecordDataset", b"TFRecordDatasetV2", b"TextLineDataset",
                 b"TextLineDatasetV2", b"FixedLengthRecordDataset",
                 b"FixedLengthRecordDatasetV2"}
_DEFAULT_SHUFFLE_SEED = 0
KERAS_BATCH_SIZE = 32
"""Keras's `fit`/`evaluate`/`predict` batch for arrays when none is given, so tfdist's too."""
EMPTY_REPLICA_BATCH = "tfdist: a replica would get a training batch with no examples"
"""The assertion tfdist adds to a training dataset, for a batch that leaves a replica none."""
_EMPTY_BATCH_ERRORS = (EMPTY_REPLICA_BATCH, "Missing 1-th output",
                       "evenly divisible by filter depth")


def is_dataset_fn(data: Any) -> bool:
  return callable(data) and not isinstance(data, tf.data.Dataset) and \
      len(inspect.signature(data).parameters) == 1


def class_weighted(dataset, class_weight):
  """`dataset` with `Model.fit`'s `class_weight` applied as Keras applies it, by Keras's own map
  (`(x, y)` batches get the sample weights of their classes; a batch with weights of its own
  is refused, as by Keras). tfdist applies it before its own steps on the dataset (the step
  clock's stamps, which Keras's map took for the targets: "too many values to unpack").

  Args:
    dataset: a `tf.data.Dataset` of batches (else returned as it is).
    class_weight: {class index: weight}, or None.

  Returns:
    The dataset of `(x, y, sample_weight)` batches, or `dataset` when `class_weight` is None.
  """
  if class_weight is None or not isinstance(dataset, tf.data.Dataset):
    return dataset
  from keras.src.trainers.data_adapters.tf_dataset_adapter import make_class_weight_map_fn
  return dataset.map(make_class_weight_map_fn(class_weight))


def validation_dataset(validation_data, strategy, batch_size: int | None):
  """The validation dataset of `validation_data`: `(x, y)` or `(x, y, sample_weight)` arrays
  batched by `batch_size`, or a dataset as it comes (`make_dataset`, as Keras's evaluate reads
  it)."""
  if isinstance(validation_data, tuple) and len(validation_data) in (2, 3):
    x, y, *weights = validation_data
    return make_dataset(x, y, strategy=strategy, batch_size=batch_size, name="validation_data",
                        sample_weight=(weights or [None])[0], method="evaluate")
  return make_dataset(validation_data, strategy=strategy, batch_size=batch_size,
                      name="validation_data", method="evaluate")


def make_dataset(x, y=None, *, strategy, batch_size: int | None, shuffle: bool = False,
                 seed: int | None = None, first_epoch: int = 0, epochs: int | None = None,
                 name: str = "x", then=None, sample_weight=None, class_weight=None,
                 method: str = "fit"):
  """Returns what Keras's fit/evaluate/predict should receive for `x` (and `y`).

  Args:
    x: numpy arrays (or a tuple/dict of them), a `tf.data.Dataset`, a `keras.utils.PyDataset`,
      a Python generator, or a dataset function.
    y: targets when `x` is numpy.
    sample_weight: weights of the examples of numpy `x`, zipped in as Keras's array adapter
      does (`(x, y, sample_weight)`); a dataset carries its own.
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
    then: a last transformation of the (per-worker) `tf.data.Dataset`, before the strategy
      distributes it.
    class_weight: `Model.fit`'s: each batch's examples weighed by their class, by Keras's own
      map (`class_weighted`), before `then` (the step clock's stamps).
    method: the Keras method that reads it ("fit", "evaluate" for fit's validation data too,
      "predict"): a PyDataset's hooks are called as that method calls them.

  Raises:
    DataError: the input is of no supported kind, or numpy input has no batch size.
  """
  if x is None:
    return None
  if sample_weight is not None and not is_arrays(x):
    raise DataError(f"{name}: sample_weight is only for numpy arrays or tensors; a dataset "
                    "carries its own weights as a third element (x, y, sample_weight), as in "
                    f"Keras. Received: sample_weight with {type(x).__name__}")
  if sample_weight is not None and y is None:
    raise DataError(f"{name}: sample_weight needs the targets y beside it. Received: y=None")
  last = then or (lambda dataset: dataset)
  then = lambda dataset: counted(last(class_weighted(dataset, class_weight)))  # noqa: E731
  if is_dataset_fn(x):
    return strategy.distribute_datasets_from_function(lambda context: then(x(context)))
  if isinstance(x, tf.distribute.DistributedDataset):
    return x
  if is_generator(x):
    x = from_generator(x, name)
  if py_datasets.is_py_dataset(x):
    _require_no_targets(y, "a PyDataset", name)
    x = py_datasets.dataset(
        x, method=method, shuffle=shuffle, seed=_DEFAULT_SHUFFLE_SEED if seed is None else seed,
        first_epoch=first_epoch, epochs=epochs, name=name)
    batch_size = None  # Its batches are the global batches, whatever their size.
  if isinstance(x, tf.data.Dataset):
    _require_no_targets(y, "a tf.data.Dataset", name)
    require_batched(x, name)
    require_batched_by(x, batch_size, name)
    return then(_refusing_empty_replica_batches(with_shard_policy(x), _replicas(strategy), name))
  if is_arrays(x):
    require_batch_size(batch_size, name)
    arrays = x if y is None else (x, y) if sample_weight is None else (x, y, sample_weight)
    # A model's several inputs as a list ([x1, x2]) are a structure, as in Keras's adapters:
    # tf.data would stack a list into one tensor.
    arrays = keras.tree.lists_to_tuples(arrays)
    arrays = _without_empty_replica_batches(arrays, batch_size, _replicas(strategy), name)
    if shuffle:
      dataset = _shuffled_epochs(arrays, batch_size, _DEFAULT_SHUFFLE_SEED if seed is None
                                 else seed, first_epoch, epochs)
    else:
      dataset = tf.data.Dataset.from_tensor_slices(arrays).batch(batch_size)
    dataset = dataset.prefetch(tf.data.AUTOTUNE)
    return then(_with_policy(dataset, tf.data.experimental.AutoShardPolicy.DATA))
  sparse = [v for v in tf.nest.flatten(x) if _is_sparse(v)]
  if sparse:
    raise DataError(f"{name}: sparse arrays are not batched by tfdist: pass a tf.data.Dataset "
                    "of their batches (from_tensor_slices(...).batch(global batch)), which "
                    f"every strategy splits. Received: {type(sparse[0]).__name__}")
  raise DataError(f"{name}: must be numpy arrays, a tf.data.Dataset, a keras.utils.PyDataset, "
                  "a Python generator or a function of a tf.distribute.InputContext. "
                  f"Received: {type(x).__name__}")


def _require_no_targets(y, kind: str, name: str) -> None:
  if y is not None:
    raise DataError(f"{name}: {kind} carries its own targets; pass y=None. "
                    f"Received: y of type {type(y).__name__}")


def counted(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """`dataset` with each element it delivers counted when a launcher watches this task
  (`tfdist.progress.count_draws`): a task whose input stopped delivering is told from its peers
  waiting for it in the same call. A TensorFlow counter, no Python call a batch (a
  `py_function` measured 130-180 us a batch, the counter about 30 us); `dataset` itself when
  not launched."""
  if not progress.watched():
    return dataset
  drawn = _draw_counter()

  def count(*element):
    with tf.control_dependencies([drawn.assign_add(1)]):
      element = tf.nest.map_structure(tf.identity, element)
    return element if len(element) > 1 else element[0]
  return dataset.map(count)


_DRAWN: list = []


def _draw_counter():
  """This process's counter of batches drawn: a plain variable on its CPU, made outside any
  strategy (a strategy's variable would be mirrored, and made by a collective)."""
  if not _DRAWN:
    from tensorflow.python.ops import resource_variable_ops  # No creator scopes, unlike
    with tf.init_scope(), tf.device("/cpu:0"):                # tf.Variable.
      _DRAWN.append(resource_variable_ops.ResourceVariable(
          0, dtype=tf.int64, trainable=False, name="tfdist_batches_drawn"))
    progress.count_draws(lambda: int(_DRAWN[0].numpy()))
  return _DRAWN[0]


def endless(dataset):
  """`dataset` repeated without end (a Dataset whose epochs Keras counts by steps); anything
  else as it is."""
  if isinstance(dataset, tf.data.Dataset) and \
      dataset.cardinality() != tf.data.INFINITE_CARDINALITY:
    return dataset.repeat()
  return dataset


def require_batch_size(batch_size: int | None, name: str) -> None:
  """Raises DataError when numpy input `name` has no batch size."""
  if not batch_size:
    raise DataError(f"{name}: numpy input needs a batch size: set training.global_batch_size "
                    "or per_replica_batch_size in the config, or pass batch_size. "
                    "Received: batch_size=None")


def is_generator(x) -> bool:
  """A Python generator or other one-pass iterator (not arrays, not a dataset)."""
  return isinstance(x, Iterator) and not isinstance(x, tf.data.Dataset)


def require_steps_for_generator(x, steps_per_epoch: int | None, name: str) -> None:
  """Raises DataError for a generator without steps_per_epoch: it is read once, as one stream
  over every epoch, so only a step count can end an epoch."""
  if is_generator(x) and not steps_per_epoch:
    raise DataError(f"{name}: a Python generator is read once, as one stream over every epoch: "
                    "make it endless and set training.steps_per_epoch (or pass "
                    "steps_per_epoch). Received: a generator and steps_per_epoch=None")


def from_generator(generator: Iterator, name: str = "x") -> tf.data.Dataset:
  """A dataset of a Python generator's batches; the signature is read off the first one."""
  try:
    first = next(generator)
  except StopIteration:
    raise DataError(f"{name}: the generator yields no batch. Received: an empty generator") \
        from None
  signature = tf.nest.map_structure(
      lambda a: tf.TensorSpec((None,) + tuple(np.shape(a))[1:], tf.as_dtype(np.asarray(a).dtype)),
      first)
  # One stream for every epoch: each epoch goes on where the last stopped.
  stream = itertools.chain([first], generator)
  return tf.data.Dataset.from_generator(lambda: stream, output_signature=signature)


def batched_by(dataset: tf.data.Dataset) -> int | None:
  """The batch size of the last `batch()` in the dataset's pipeline, or None without one."""
  while dataset is not None:
    size = getattr(dataset, "_batch_size", None)
    if size is not None:
      return int(size)
    dataset = getattr(dataset, "_input_dataset", None)
  return None


def require_batched(dataset: tf.data.Dataset, name: str) -> None:
  """Raises DataError for a dataset of single examples: one with a scalar element (a batch has
  a batch dimension), or sliced from tensors with no batch after (`from_tensor_slices` alone).
  tf.distribute would fail inside its own code (an IndexError splitting a batch)."""
  ranks = [spec.shape.rank for spec in tf.nest.flatten(dataset.element_spec)
           if isinstance(spec, tf.TensorSpec)]
  scalar = any(rank == 0 for rank in ranks)
  if scalar or (batched_by(dataset) is None and _sliced_without_batch(dataset)):
    raise DataError(f"{name}: a tf.data.Dataset must yield batches (call .batch(global batch "
                    "size) on it; tfdist.global_batch_size() gives the size). Received: a "
                    f"dataset of single examples, element shapes "
                    f"{[tuple(s.shape) for s in tf.nest.flatten(dataset.element_spec)]}")


def _sliced_without_batch(dataset) -> bool:
  while dataset is not None:
    kind = type(dataset).__name__.lower()
    if "batch" in kind or "window" in kind or "group" in kind or "generator" in kind:
      return False
    if "tensorslice" in kind:
      return True
    dataset = getattr(dataset, "_input_dataset", None)
  return False


def require_batched_by(dataset: tf.data.Dataset, batch_size: int | None, name: str) -> None:
  """Raises DataError when the dataset's batch size is not the config's global batch."""
  batched = batched_by(dataset)
  if batch_size and batched is not None and batched != batch_size:
    raise DataError(f"{name}: a tf.data.Dataset must be batched by the global batch size, "
                    f"{batch_size} (training.global_batch_size, or per_replica_batch_size x "
                    f"replicas); or leave the batch size out of the config. Received: a dataset "
                    f"batched by {batched}")


def require_serializable(dataset: tf.data.Dataset, name: str,
                         where: str = "parameter-server workers rebuild",
                         advice: str = "pass a dataset function that builds it from arrays or "
                                       "files") -> None:
  """Raises DataError when the dataset cannot be rebuilt elsewhere from its graph, as
  parameter-server workers rebuild it (`ClusterCoordinator.create_per_worker_dataset`) or the
  tf.data service's data workers run it (`where` says who, `advice` what to do)."""
  try:
    dataset._as_serialized_graph(
        external_state_policy=tf.data.experimental.ExternalStatePolicy.FAIL)
  except tf.errors.FailedPreconditionError:
    raise DataError(f"{name}: {where} the dataset from its graph, and this one runs Python "
                    f"code (from_generator or py_function): {advice}. Received: a dataset "
                    "with Python state") from None


NOT_KEPT_BY_THE_SERVICE = {
    "ShardDataset": ".shard(): the service splits each pass over its data workers itself, and "
                    "each data worker would keep only its shard of its share (129 of 256 "
                    "examples an epoch, measured): leave .shard() out, the service gives "
                    "each example once",
}
"""The dataset ops the tf.data service cannot run as the user's pipeline means them, with
why and what to do. (Python state is `require_serializable`'s.)"""


def require_servable(dataset: tf.data.Dataset, name: str) -> None:
  """Raises DataError for a dataset the tf.data service's data workers cannot run exactly:
  Python state (from_generator, py_function) or an op of `NOT_KEPT_BY_THE_SERVICE`.

  Args:
    dataset: the training dataset sent to the service.
    name: the argument it came as, named in the error.

  Raises:
    DataError: it cannot be sent, or would not be kept exact there.

  Example:

  ```python
  require_servable(tf.data.Dataset.range(8).shard(2, 0).batch(4), "train_data")   # DataError
  ```
  """
  require_serializable(dataset, name, "the tf.data service's data workers run",
                       "build it from arrays or files, or leave the service out")
  ops = {node.op for node in _nodes(dataset)}
  for op, why in NOT_KEPT_BY_THE_SERVICE.items():
    if op in ops:
      raise DataError(f"{name}: the tf.data service's data workers cannot run {why}. "
                      f"Received: a dataset with {op}")


def usable_count(count: int, batch_size: int, replicas: int) -> int:
  """How many of `count` examples to train on so that no replica gets an empty batch. Pure.

  A last batch of b examples is split over k replicas in pieces of ceil(b/k): when those run
  out before the last replica, it gets none, and TensorFlow's convolution gradients fail on an
  empty batch ("Missing 1-th output from Conv2DBackpropFilter"). Leaving out b mod k examples
  (fewer than k) gives every replica at least one.
  """
  last = count % batch_size
  if replicas <= 1 or not last or not leaves_a_replica_empty(last, replicas):
    return count
  return count - last % replicas


def leaves_a_replica_empty(rows, replicas: int):
  """Whether a batch of `rows` examples (an int or an int tensor), split over `replicas` in
  pieces of ceil(rows/replicas) as tf.distribute splits it, leaves the last replica none."""
  return -(-rows // replicas) * (replicas - 1) >= rows


def _without_empty_replica_batches(arrays, batch_size: int, replicas: int, name: str):
  count = len(tf.nest.flatten(arrays)[0])
  keep = usable_count(count, batch_size, replicas)
  if keep == count:
    return arrays
  print(f"tfdist: {name}: its last batch of {count % batch_size} examples would leave one of "
        f"the {replicas} replicas without examples; the last {count - keep} example(s) are left "
        "out of each epoch", flush=True)
  return tf.nest.map_structure(lambda a: a[:keep], arrays)


def _refusing_empty_replica_batches(dataset: tf.data.Dataset, replicas: int, name: str):
  """`dataset` failing with `EMPTY_REPLICA_BATCH` at a training batch too small to give each of
  `replicas` an example (`usable_count`'s split). Keras averages the replicas' mean losses, so
  an empty replica would halve that step's gradient: a silent drift where TensorFlow's kernels
  accept an empty batch (Eigen's), an error where they do not (oneDNN's convolutions)."""
  if replicas <= 1 or name != "train_data":
    return dataset

  def checked(*element):
    first = next((t for t in tf.nest.flatten(element) if isinstance(t, tf.Tensor)), None)
    if first is not None and first.shape.rank:  # Only ragged or sparse parts: not counted.
      empty = leaves_a_replica_empty(tf.shape(first)[0], replicas)
      with tf.control_dependencies([tf.debugging.Assert(tf.logical_not(empty),
                                                        [EMPTY_REPLICA_BATCH])]):
        element = tf.nest.map_structure(tf.identity, element)
    return element if len(element) > 1 else element[0]
  return dataset.map(checked)


def batch_count(x, batch_size: int, replicas: int = 1) -> int:
  """Batches in one epoch of numpy input `x` over `replicas`, the last one partial."""
  return -(-usable_count(len(tf.nest.flatten(x)[0]), batch_size, replicas) // batch_size)


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


@contextlib.contextmanager
def empty_batches_explained(name: str):
  """Turns TensorFlow's kernel error for a replica's empty batch into a DataError saying what to
  change (a dataset's last batch, split over the replicas, left one with no examples)."""
  try:
    yield
  except (tf.errors.InternalError, tf.errors.InvalidArgumentError) as e:
    if not any(text in str(e) for text in _EMPTY_BATCH_ERRORS):
      raise
    raise DataError(f"{name}: a replica received an empty batch (the data's last batch, split "
                    "over the replicas, left it none): Keras would average its loss with the "
                    "others' as if it had examples, and TensorFlow's convolution gradients fail "
                    "on one under oneDNN: batch with drop_remainder=True, or pass numpy arrays "
                    "(tfdist then leaves out the few examples concerned). Received: "
                    f"{type(e).__name__}") from None


def _replicas(strategy) -> int:
  return 1 if strategy is None else strategy.num_replicas_in_sync


def is_arrays(x) -> bool:
  leaves = tf.nest.flatten(x)
  return bool(leaves) and all((isinstance(v, (np.ndarray, list)) or tf.is_tensor(v)) and
                              not _is_sparse(v) for v in leaves)


def _is_sparse(v) -> bool:
  return isinstance(v, tf.SparseTensor) or type(v).__module__.startswith("scipy.sparse")


def with_shard_policy(dataset: tf.data.Dataset) -> tf.data.Dataset:
  if dataset.options().experimental_distribute.auto_shard_policy != \
      tf.data.experimental.AutoShardPolicy.AUTO:
    return dataset  # The caller chose.
  policy = (tf.data.experimental.AutoShardPolicy.FILE if reads_files(dataset)
            else tf.data.experimental.AutoShardPolicy.DATA)
  return _with_policy(dataset, policy)


def reads_files(dataset: tf.data.Dataset) -> bool:
  """True when the dataset's graph has a file reader (TFRecord, text line, fixed length)."""
  return bool({node.op.encode() for node in _nodes(dataset)} & _FILE_READERS)


def reshuffles(dataset) -> bool:
  """True when `dataset` (a `tf.data.Dataset`) shuffles anew each time it is iterated
  (`shuffle(..., reshuffle_each_iteration=True)`, the default): the order of an epoch then
  depends on how many times it was iterated before."""
  if not isinstance(dataset, tf.data.Dataset):
    return False
  return any(node.op.startswith("ShuffleDataset") and (
      node.op == "ShuffleDatasetV2" or node.attr["reshuffle_each_iteration"].b)
      for node in _nodes(dataset))


def _nodes(dataset: tf.data.Dataset) -> list:
  graph = tf.compat.v1.GraphDef()
  graph.ParseFromString(dataset._as_serialized_graph().numpy())
  return [*graph.node, *(node for f in graph.library.function for node in f.node_def)]


def _with_policy(dataset: tf.data.Dataset, policy) -> tf.data.Dataset:
  options = tf.data.Options()
  options.experimental_distribute.auto_shard_policy = policy
  return dataset.with_options(options)
