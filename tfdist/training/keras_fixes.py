"""Workarounds for Keras 3 bugs under tf.distribute, applied only inside tfdist's own calls.

Each fix names its upstream issue, is guarded by the Keras version, and has a test
(tests/test_keras_fixes.py) that runs Keras unpatched and fails once upstream is fixed: then
delete the fix.
"""

from __future__ import annotations

import contextlib
import types

import keras
import tensorflow as tf
from keras.src.backend.tensorflow import trainer as tf_trainer

# Versions known to need the fixes; raise the bound once a test shows a newer one still does.
_BROKEN = (3, 0) <= tuple(int(p) for p in keras.version().split(".")[:2]) < (3, 16)


def in_multi_worker_mode(strategy) -> bool:
  return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and \
      strategy.extended._in_multi_worker_mode()


def _central_storage(strategy) -> bool:
  return isinstance(strategy, tf.distribute.experimental.CentralStorageStrategy) and \
      strategy.num_replicas_in_sync > 1


@contextlib.contextmanager
def fixed_for(model, strategy):
  """Applies the fixes `strategy` needs around one fit/evaluate/predict of `model`."""
  if _BROKEN and _central_storage(strategy):
    model._maybe_symbolic_build = types.MethodType(_build_with_summed_metric_deltas, model)
  if not (_BROKEN and in_multi_worker_mode(strategy)):
    yield
    return
  # keras-team/keras#20585: the symbolic build reduces the nested (x, y) PerReplica batch with
  # strategy.reduce, which accepts no nesting. Build from the first local replica's tensors.
  model._maybe_symbolic_build = types.MethodType(_build_from_local_replica, model)
  # keras-team/keras#20585: reduce_per_replica reduces rank-0 losses with axis=0. Use axis=None.
  original = tf_trainer.reduce_per_replica
  tf_trainer.reduce_per_replica = lambda values, strategy, reduction: _reduce_scalars_whole(
      original, values, strategy, reduction)
  try:
    yield
  finally:
    tf_trainer.reduce_per_replica = original


def _build_from_local_replica(self, iterator=None, data_batch=None):
  if iterator is not None:
    for _, _, it in iterator:
      data_batch = tf.nest.map_structure(
          lambda v: self.distribute_strategy.experimental_local_results(v)[0], next(it))
      break
  with self.distribute_strategy.scope():
    self._symbolic_build(data_batch=data_batch)


def _build_with_summed_metric_deltas(self, iterator=None, data_batch=None):
  type(self)._maybe_symbolic_build(self, iterator=iterator, data_batch=data_batch)
  # keras-team/keras#21054: Keras's assign_add is assign(self + delta). Under CentralStorage a
  # metric variable is an AggregatingVariable(SUM), which sums the replicas' assigned values
  # (old total counted once per replica). TensorFlow's own assign_add sums the deltas.
  for variable in self.metrics_variables:
    variable.assign_add = types.MethodType(_add_delta, variable)


def _add_delta(variable, value):
  return variable.value.assign_add(tf.cast(value, variable.dtype))


def _reduce_scalars_whole(original, values, strategy, reduction):
  def reduce(value):
    if reduction in ("auto", "mean") and getattr(value, "shape", None) is not None and \
        value.shape.rank == 0:
      return strategy.reduce("MEAN", value, axis=None)
    return original(value, strategy, reduction)
  return tf.nest.map_structure(reduce, values)
