"""Gradient accumulation that all-reduces once per update, not once per batch.

Keras's accumulation (and tfdist's fix of it under a strategy, keras-team/keras#20582)
all-reduces every batch's gradients, so accumulating N batches saves no communication. Here each
replica adds its gradients into its own accumulators (`SyncOnRead` variables: one copy per
replica, no communication); on every N-th batch the sum of the N local gradients is all-reduced
once and the variables updated with it / N, Keras's arithmetic (clipping and weight decay
included), and the local accumulators are zeroed.

tfdist's in-graph step loop runs the batches of a call as "local" and "update" steps laid out
from the optimizer's batch counter (`layout`), so the all-reduce is never inside a `tf.cond`; a
training step traced outside that loop keeps the all-reduce-every-batch path.

```python
install(optimizer, strategy)       # after the optimizer is built, in the strategy's scope
optimizer.tfdist_phase = "local"   # while tracing a step that only accumulates
```
"""

from __future__ import annotations

import types

import tensorflow as tf


def install(optimizer, strategy, every_batch) -> None:
  """Makes `optimizer` accumulate locally; `every_batch` is the all-reduce-every-batch
  `_backend_apply_gradients` used when no phase is set."""
  optimizer.tfdist_phase = None
  build = optimizer.build

  def build_with_local_accumulators(variables):
    build(variables)
    with strategy.scope():
      optimizer.tfdist_local = [
          tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                      synchronization=tf.VariableSynchronization.ON_READ,
                      aggregation=tf.VariableAggregation.SUM, name="tfdist_local_accumulator")
          for v in optimizer._trainable_variables]
  if optimizer.built:
    build_with_local_accumulators(optimizer._trainable_variables)
  else:
    optimizer.build = build_with_local_accumulators
  optimizer._backend_apply_gradients = types.MethodType(
      lambda self, grads, variables: _apply(self, grads, variables, every_batch), optimizer)


def layout(iterations, steps, every: int):
  """(local steps first, update groups, local steps after the last update) for `steps` batches
  starting at batch `iterations` (the optimizer's `_iterations`): a group is an update step
  followed by `every` - 1 local steps (the last group by the trailing ones). Tensors, no
  branching."""
  pending = tf.cast(iterations % every, tf.int32)
  lead = tf.minimum((every - 1 - pending) % every, steps)
  rest = steps - lead
  groups = (rest + every - 1) // every
  trail = tf.where(groups > 0, rest - 1 - (groups - 1) * every, 0)
  return lead, groups, trail


def _apply(self, grads, trainable_variables, every_batch):
  if self.tfdist_phase is None:
    return every_batch(self, grads, trainable_variables)
  local = [self.tfdist_local[self._get_variable_index(v)] for v in trainable_variables]
  if self.tfdist_phase == "local":
    for g, a in zip(grads, local):
      a.assign_add(g)
    return None
  steps = self.gradient_accumulation_steps
  variables = [v.value for v in trainable_variables]
  summed = [g + a.read_value() for g, a in zip(grads, local)]
  # Keras's all-reduce, or tfdist's compressed or timed one: once for the N batches.
  reduced = [g for g, _ in self._all_reduce_sum_gradients(list(zip(summed, variables)))]
  averaged = self._clip_gradients([g / steps for g in reduced])
  learning_rate = self.learning_rate

  def update(distribution, averaged):
    self._apply_weight_decay(variables)
    self._distributed_tf_update_step(distribution, list(zip(averaged, variables)), learning_rate)
  tf.distribute.get_replica_context().merge_call(update, args=(averaged,))
  for a in local:
    a.assign(tf.zeros_like(a))
  return None
