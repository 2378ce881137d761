"""Tensor (vertical) parallelism: one Dense layer's kernel split over devices (Megatron-LM's
column- and row-parallel linear layers).

- `ColumnParallelDense`: device i holds columns i of the kernel (and of the bias) and computes
  its slice of the outputs, activation included; the slices are concatenated. Exact.
- `RowParallelDense`: device i holds rows i of the kernel and multiplies its slice of the input
  features; the partial products are summed, then the bias and activation. Equal up to the
  order of the sum.

A column-parallel layer followed by a row-parallel one (an MLP block, or attention's
query/key/value then output projections) passes its slices straight on with `gather=False`:
one sum between the two instead of a concatenation and a split.

```python
hidden = ColumnParallelDense(4096, devices, activation="relu", gather=False)(x)
y = RowParallelDense(1024, devices)(hidden)
layer = column_parallel(model.get_layer("dense"), devices)   # from a built Dense
```
"""

from __future__ import annotations

from typing import Sequence

import keras
import numpy as np
import tensorflow as tf


def _shards(total: int, parts: int) -> list[int]:
  """Sizes of `parts` slices of `total`, as even as can be. Pure."""
  return [total // parts + (i < total % parts) for i in range(parts)]


class _ParallelDense(keras.layers.Layer):
  tfdist_manages_devices = True  # `placement.place` leaves its variables where they are.

  def __init__(self, units: int, devices: Sequence[str], activation=None, use_bias: bool = True,
               **kwargs):
    super().__init__(**kwargs)
    self.units, self.devices = units, list(devices)
    self.activation, self.use_bias = keras.activations.get(activation), use_bias

  def get_config(self):
    return {**super().get_config(), "units": self.units, "devices": self.devices,
            "activation": keras.activations.serialize(self.activation),
            "use_bias": self.use_bias}

  def _weights_on(self, device, shape, name):
    with tf.device(device):
      return self.add_weight(shape=shape, initializer="glorot_uniform", name=name)


class ColumnParallelDense(_ParallelDense):
  """A Dense layer whose output columns are split over `devices`.

  Args:
    units: output features, over all devices.
    devices: one slice of the columns each.
    activation, use_bias: as for `keras.layers.Dense`.
    gather: concatenate the slices (True) or return the list of per-device slices for a
      `RowParallelDense` after it.
  """

  def __init__(self, units, devices, activation=None, use_bias=True, gather=True, **kwargs):
    super().__init__(units, devices, activation, use_bias, **kwargs)
    self.gather = gather

  def get_config(self):
    return {**super().get_config(), "gather": self.gather}

  def build(self, input_shape):
    sizes = _shards(self.units, len(self.devices))
    self.kernels = [self._weights_on(d, (input_shape[-1], n), f"kernel_{i}")
                    for i, (d, n) in enumerate(zip(self.devices, sizes))]
    self.biases = [self._bias_on(d, n, i) for i, (d, n) in enumerate(zip(self.devices, sizes))]

  def _bias_on(self, device, size, i):
    if not self.use_bias:
      return None
    with tf.device(device):
      return self.add_weight(shape=(size,), initializer="zeros", name=f"bias_{i}")

  def call(self, inputs):
    slices = []
    for device, kernel, bias in zip(self.devices, self.kernels, self.biases):
      with tf.device(device):
        y = tf.matmul(inputs, kernel)
        slices.append(self.activation(y if bias is None else y + bias))
    return tf.concat(slices, -1) if self.gather else slices

  def compute_output_spec(self, inputs):
    shape = (*inputs.shape[:-1],)
    if self.gather:
      return keras.KerasTensor((*shape, self.units), dtype=self.compute_dtype)
    return [keras.KerasTensor((*shape, n), dtype=self.compute_dtype)
            for n in _shards(self.units, len(self.devices))]


class RowParallelDense(_ParallelDense):
  """A Dense layer whose input rows are split over `devices`; takes the full input, or the
  list of slices a `ColumnParallelDense(gather=False)` gives."""

  def build(self, input_shape):
    rows = ([s[-1] for s in input_shape] if isinstance(input_shape, list)
            else _shards(input_shape[-1], len(self.devices)))
    self.kernels = [self._weights_on(d, (n, self.units), f"kernel_{i}")
                    for i, (d, n) in enumerate(zip(self.devices, rows))]
    self.bias = self.add_weight(shape=(self.units,), initializer="zeros",
                                name="bias") if self.use_bias else None

  def call(self, inputs):
    if not isinstance(inputs, (list, tuple)):
      sizes = [int(k.shape[0]) for k in self.kernels]
      inputs = tf.split(inputs, sizes, axis=-1)
    partial = []
    for device, kernel, x in zip(self.devices, self.kernels, inputs):
      with tf.device(device):
        partial.append(tf.matmul(x, kernel))
    y = tf.add_n(partial)
    return self.activation(y if self.bias is None else y + self.bias)

  def compute_output_spec(self, inputs):
    first = inputs[0] if isinstance(inputs, (list, tuple)) else inputs
    return keras.KerasTensor((*first.shape[:-1], self.units), dtype=self.compute_dtype)


def column_parallel(dense: keras.layers.Dense, devices: Sequence[str], gather: bool = True):
  """A built `ColumnParallelDense` with `dense`'s weights, split by columns."""
  layer = ColumnParallelDense(dense.units, devices, dense.activation, dense.use_bias,
                              gather=gather, name=f"{dense.name}_columns")
  kernel = dense.kernel.numpy()
  layer.build(kernel.shape[:1])
  cuts = np.cumsum(_shards(dense.units, len(devices)))[:-1]
  for variable, part in zip(layer.kernels, np.split(kernel, cuts, axis=1)):
    variable.assign(part)
  if dense.use_bias:
    for variable, part in zip(layer.biases, np.split(dense.bias.numpy(), cuts)):
      variable.assign(part)
  return layer


def row_parallel(dense: keras.layers.Dense, devices: Sequence[str]):
  """A built `RowParallelDense` with `dense`'s weights, split by rows."""
  layer = RowParallelDense(dense.units, devices, dense.activation, dense.use_bias,
                           name=f"{dense.name}_rows")
  kernel = dense.kernel.numpy()
  layer.build(kernel.shape[:1])
  cuts = np.cumsum(_shards(kernel.shape[0], len(devices)))[:-1]
  for variable, part in zip(layer.kernels, np.split(kernel, cuts, axis=0)):
    variable.assign(part)
  if dense.use_bias:
    layer.bias.assign(dense.bias.numpy())
  return layer
