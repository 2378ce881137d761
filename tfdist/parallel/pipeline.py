"""Training and predicting a model split over devices, in micro-batches (GPipe).

Keras's `train_step` takes its gradients with a `GradientTape`, whose gradient ops land on the
default device: stage 2's backward pass would run on device 0. `tf.gradients` places each
gradient op with its forward op, so each stage's backward pass stays on its device.

With `microbatches: M` a batch is split into M parts, each run forward and backward, and the
gradients summed (weighted by each part's share of the batch) before one update: the full
batch's gradients up to rounding (layers that see the whole batch at once, such as
BatchNormalization, see a micro-batch instead, as in GPipe). All micro-batches sit in one
graph: TensorFlow's executor runs an op once its inputs are ready, so stage 2 works on
micro-batch m while stage 1 works on micro-batch m+1 -- GPipe's fill-and-drain schedule, by
data flow. The bubble is (S-1)/(M+S-1) of a step for S stages.

```python
model.train_step = functools.partial(train_step, model, microbatches=4, last_device=d)
```
"""

from __future__ import annotations

import tensorflow as tf
import keras


def split_batch(data, parts: int):
  """`parts` micro-batches of `data` (any nest of tensors with the batch first), as even as can
  be; a batch of fewer than `parts` examples gives some empty ones."""
  leaves = tf.nest.flatten(data)
  size = tf.shape(next(t for t in leaves if t is not None))[0]
  sizes = size // parts + tf.cast(tf.range(parts) < size % parts, tf.int32)
  pieces = [None if t is None else tf.split(t, sizes, num=parts) for t in leaves]
  return [tf.nest.pack_sequence_as(data, [None if p is None else p[i] for p in pieces])
          for i in range(parts)], sizes, size


def train_step(model, data, *, microbatches: int = 1, last_device: str | None = None,
               reduce_gradients=None):
  """Keras's `train_step` with gradients placed per stage and the batch in `microbatches`;
  `reduce_gradients(gradients, variables)` (hybrid training) runs before the update."""
  x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
  variables = model.trainable_weights
  parts = _parts((x, y, sample_weight), microbatches)
  total_loss, gradients, predictions = 0.0, None, []
  for (x_m, y_m, w_m), share in parts:
    y_pred = model(x_m, training=True) if model._call_has_training_arg else model(x_m)
    with tf.device(last_device):
      loss = model._compute_loss(x=x_m, y=y_m, y_pred=y_pred, sample_weight=w_m, training=True)
      weighted = loss * tf.cast(share, loss.dtype)
      scaled = model.optimizer.scale_loss(weighted)
    grads = tf.gradients(scaled, [v.value for v in variables])
    gradients = grads if gradients is None else [
        _add_on(v, a, b) for v, a, b in zip(variables, gradients, grads)]
    total_loss += weighted
    predictions.append(y_pred)
  batch = tf.shape(next(t for t in tf.nest.flatten(x) if t is not None))[0]
  model._loss_tracker.update_state(total_loss, sample_weight=batch)
  if reduce_gradients is not None:
    gradients = reduce_gradients(gradients, variables)
  model.optimizer.apply_gradients(zip(gradients, variables))
  y_pred = tf.nest.map_structure(lambda *p: tf.concat(p, 0), *predictions)
  return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def predict_step(model, data, *, microbatches: int = 1):
  """Keras's `predict_step` in `microbatches`, so the stages overlap."""
  x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
  outputs = [model(x_m, training=False) if model._call_has_training_arg else model(x_m)
             for x_m, _ in _parts(x, microbatches)]
  return tf.nest.map_structure(lambda *p: tf.concat(p, 0), *outputs)


def _parts(data, microbatches: int):
  if microbatches == 1:
    return [(data, 1.0)]
  parts, sizes, size = split_batch(data, microbatches)
  shares = tf.cast(sizes, tf.float32) / tf.cast(tf.maximum(size, 1), tf.float32)
  return [(part, shares[i]) for i, part in enumerate(parts)]


def _add_on(variable, a, b):
  """`a + b` on `variable`'s device; two `IndexedSlices` (an Embedding's rows looked up by two
  micro-batches) are summed sparse, their rows concatenated: the optimizer adds rows that
  repeat, as it does for one batch that looks a row up twice."""
  if a is None or b is None:
    return a if b is None else b
  with tf.device(variable.value.device):
    if isinstance(a, tf.IndexedSlices) and isinstance(b, tf.IndexedSlices):
      return tf.IndexedSlices(tf.concat([a.values, b.values], 0),
                              tf.concat([a.indices, b.indices], 0), a.dense_shape)
    return tf.convert_to_tensor(a) + tf.convert_to_tensor(b)
