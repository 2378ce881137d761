"""Per-replica code written as for one device, giving one device's gradients and losses.

A user's step (`tf.reduce_mean` of the per-example loss, `tape.gradient`,
`optimizer.apply_gradients`) run on R replicas goes wrong in two ways under tf.distribute and
Keras 3:

- the optimizer sums the replicas' gradients: each replica's mean-loss gradient counted R
  times (measured: one device with twice the learning rate gives the same epoch-2 loss);
- Keras divides every mean-reduced Keras loss by R inside a replica (`scale_loss_for_distribution`)
  so that the sum comes out right, which halves the loss a user reports and makes
  `tf.reduce_mean` and `keras.losses.*` disagree.

While tfdist runs a user's step, Keras's scaling is off (a loss is the replica's mean, as on one
device), and the optimizer weights each replica's gradients by its share of the global batch
(its rows / the global batch size) before summing them: the sum is the global batch's mean
gradient, `tf.nn.compute_average_loss(..., global_batch_size)`'s semantics, with regularization
losses counted once. A replica's mean reported loss weighted the same way sums to the global
mean.

```python
weight_gradients_by_share(optimizer)          # once
with unscaled_keras_losses():                 # around tracing the step
  strategy.run(lambda batch: with_share(batch, global_batch, lambda: step(batch)), ...)
```
"""

from __future__ import annotations

import contextlib
import threading

import tensorflow as tf
from keras.src.losses import loss as keras_loss

from tfdist.strategy import gradient_reduction

_SHARES: dict[int, tf.Tensor] = {}  # Replica thread -> its share of the global batch.


def rows(data) -> tf.Tensor:
  """The number of examples in `data` (any nest of tensors, batch first)."""
  first = next(t for t in tf.nest.flatten(data) if t is not None)
  return tf.shape(first)[0]


def with_share(data, global_batch: int, run):
  """`run()` with this replica's share of the global batch (`data`'s rows / `global_batch`)
  known to the optimizer's all-reduce; returns (run's result, the share)."""
  share = tf.cast(rows(data), tf.float32) / float(global_batch)
  key = threading.get_ident()  # MirroredStrategy traces each replica in its own thread.
  _SHARES[key] = share
  try:
    return run(), share
  finally:
    _SHARES.pop(key, None)


def weight_gradients_by_share(optimizer) -> None:
  """Makes `optimizer` (this object) weight each replica's gradients by its share of the global
  batch before its all-reduce sums them, inside `with_share`; elsewhere (Keras's own
  `train_step`, one replica) its all-reduce is unchanged."""
  if getattr(optimizer, "tfdist_weighted", False):
    return
  def weighted(reduce, grads_and_vars):
    share = _SHARES.get(threading.get_ident())
    context = tf.distribute.get_replica_context()
    if share is None or context is None or context.num_replicas_in_sync == 1:
      return reduce(grads_and_vars)
    return reduce([(g if g is None else _scaled(g, share), v) for g, v in grads_and_vars])
  gradient_reduction.wrap(optimizer, weighted)
  optimizer.tfdist_weighted = True


def _scaled(gradient, share):
  if isinstance(gradient, tf.IndexedSlices):
    return tf.IndexedSlices(gradient.values * tf.cast(share, gradient.values.dtype),
                            gradient.indices, gradient.dense_shape)
  return gradient * tf.cast(share, gradient.dtype)


@contextlib.contextmanager
def unscaled_keras_losses():
  """Keras's mean-reduced losses (and its loss tracker) are each replica's own mean, as on one
  device, while inside: Keras's per-replica division and multiplication by the replica count
  (`keras.src.losses.loss.scale_loss_for_distribution` and its inverse) are the identity."""
  scale, unscale = keras_loss.scale_loss_for_distribution, keras_loss.unscale_loss_for_distribution
  keras_loss.scale_loss_for_distribution = keras_loss.unscale_loss_for_distribution = _same
  try:
    yield
  finally:
    keras_loss.scale_loss_for_distribution, keras_loss.unscale_loss_for_distribution = \
        scale, unscale


def _same(value):
  return value
