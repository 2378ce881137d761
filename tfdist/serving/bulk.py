"""Bulk prediction at the speed of a hand-written loop, under any synchronous strategy.

Keras's `predict` costs a fixed ~120 ms a call, keeps every output in memory
(keras-team/keras#21642), and at batch 256 gives ~0.6 of a hand-written loop over a
`tf.function` with a fixed signature. This is that loop: one traced function for the batch
size (a short last batch is padded, then trimmed), each batch split over the strategy's replicas
in order (a contiguous slice per replica, across workers too) and gathered back, the outputs
written into one preallocated array (or a `.npy` file on disk, or streamed batch by batch).

```python
predictions = bulk_predict(model, x, batch_size=256)                 # numpy, input order
bulk_predict(model, x, batch_size=256, out="predictions.npy")        # written to disk
for batch in bulk_predict(model, dataset, batch_size=256, stream=True): ...
```
"""

from __future__ import annotations

import os
from typing import Iterator

import numpy as np
import tensorflow as tf

from tfdist.serving.model import pad_rows


def bulk_predict(model, x, *, batch_size: int | None, out=None, stream: bool = False):
  """Predicts `x` (numpy arrays, or a `tf.data.Dataset` of batches) in input order.

  Args:
    model: a built Keras model; runs under its own strategy (`model.distribute_strategy`).
    x: numpy arrays (a nest of them for several inputs) or a dataset of batches.
    batch_size: rows per step, over all replicas (a dataset's own batches when `x` is one).
    out: a preallocated array (or `np.memmap`) to write into, or a path: a `.npy` file written
      as the batches come (numpy input, one output).
    stream: return an iterator of output batches instead of the whole output.

  Returns:
    The outputs (a nest like the model's), `out`, or an iterator of output batches.
  """
  batches = _batches(x, batch_size)
  step = _Step(model, batch_size)
  outputs = (step(batch) for batch in batches)
  if stream:
    return outputs
  rows = _rows(x)
  if rows is None:  # A dataset: its length is known at its end.
    parts = list(outputs)
    return tf.nest.map_structure(lambda *p: np.concatenate(p), *parts) if parts else None
  result, done = out, 0
  for output in outputs:
    if result is None or isinstance(result, (str, os.PathLike)):
      result = _allocate(output, rows, path=result)
    count = len(tf.nest.flatten(output)[0])
    for target, part in zip(tf.nest.flatten(result), tf.nest.flatten(output)):
      target[done:done + count] = part
    done += count
  for target in tf.nest.flatten(result):
    if isinstance(target, np.memmap):
      target.flush()
  return result


class _Step:
  """The traced step of one batch size: pad, split over replicas, predict, gather, trim."""

  def __init__(self, model, batch_size: int | None):
    self.model, self.strategy = model, model.distribute_strategy
    self.batch_size, self.rows, self.function = batch_size, None, None

  def __call__(self, batch) -> object:
    count = len(tf.nest.flatten(batch)[0])
    if self.function is None:  # A dataset's batch size is its first batch's.
      replicas = self.strategy.num_replicas_in_sync
      size = self.batch_size or count
      self.rows = -(-size // replicas) * replicas  # Every replica the same slice.
      self.function = self._trace(batch)
    if count > self.rows:
      raise ValueError(f"x: a batch of {count} rows is larger than the first ({self.rows}); "
                       "batch the dataset evenly")
    padded = tf.nest.map_structure(lambda a: pad_rows(np.asarray(a), self.rows), batch)
    output = self.function(padded)
    return tf.nest.map_structure(lambda t: t.numpy()[:count], output)

  def _trace(self, batch):
    strategy, model, rows = self.strategy, self.model, self.rows
    replicas = strategy.num_replicas_in_sync
    spec = tf.nest.map_structure(
        lambda a: tf.TensorSpec([rows, *np.shape(a)[1:]], tf.as_dtype(np.asarray(a).dtype)),
        batch)

    def predict(inputs):
      return model.predict_step((inputs,))

    @tf.function(input_signature=[spec])
    def step(inputs):
      if replicas == 1:
        return predict(inputs)
      share = rows // replicas
      local = strategy.experimental_distribute_values_from_function(
          lambda context: tf.nest.map_structure(
              lambda t: t[context.replica_id_in_sync_group * share:
                          (context.replica_id_in_sync_group + 1) * share], inputs))
      outputs = strategy.run(predict, args=(local,))
      return tf.nest.map_structure(lambda o: strategy.gather(o, axis=0), outputs)
    return step


def _batches(x, batch_size: int) -> Iterator:
  if isinstance(x, tf.data.Dataset):
    for batch in x:
      yield tf.nest.map_structure(lambda t: t.numpy(), batch)
    return
  rows = _rows(x)
  for start in range(0, rows, batch_size):
    yield tf.nest.map_structure(lambda a: a[start:start + batch_size], x)


def _rows(x) -> int | None:
  if isinstance(x, tf.data.Dataset):
    return None
  return len(tf.nest.flatten(x)[0])


def _allocate(output, rows: int, path=None):
  def one(part):
    shape = (rows, *part.shape[1:])
    if path is None:
      return np.empty(shape, part.dtype)
    return np.lib.format.open_memmap(os.fspath(path), mode="w+", dtype=part.dtype, shape=shape)
  if path is not None and len(tf.nest.flatten(output)) != 1:
    raise ValueError(f"out: a .npy path holds one output; the model has "
                     f"{len(tf.nest.flatten(output))}. Received: {path!r}")
  return tf.nest.map_structure(one, output)
