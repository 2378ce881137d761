"""Which device each layer of a model lives on, and putting it there.

Keras 3 gives nothing for this on TensorFlow: `keras.distribution.ModelParallel` builds, fits
and places every weight, full size, on one device (its TensorFlow backend is a prototype,
keras-team/keras#18473). A layer built under `tf.device(D)` has its variables on D, but Keras's
`fit` runs its ops on the default device; so `place` does both: it re-creates each layer's
variables on its device and runs the layer's `call` under that device.

A placement is one of:
  - stages: a list per device of layer names or indices, contiguous and in order;
  - a map {layer name: device}; a layer not named stays with the layer before it;
  - "balanced": contiguous stages with parameter counts as even as they can be.

```python
assignment = assign(model, "balanced", ["/device:GPU:0", "/device:GPU:1"])
place(model, assignment)
```
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Sequence

import keras
import tensorflow as tf

from tfdist.errors import ConfigError


def local_devices() -> list[str]:
  """This process's devices for stages: its GPUs, else its (logical) CPUs."""
  gpus = _local(tf.config.list_logical_devices("GPU"))
  return gpus or _local(tf.config.list_logical_devices("CPU"))


def _local(devices) -> list[str]:
  """The names of `devices` on this task (in a cluster TensorFlow lists every task's)."""
  from tensorflow.python.eager import context
  host = context.context().host_address_space()
  return [d.name for d in devices
          if d.name.startswith(host + "/") or not d.name.startswith("/job:")]


def assign(model, placement: Any, devices: Sequence[str]) -> dict[str, str]:
  """{layer name: device} for every layer of `model` (`model.layers`, in order).

  Raises:
    ConfigError: a device that does not exist, a layer the model lacks, stages out of order.
  """
  layers = [layer.name for layer in model.layers]
  devices = [_canonical(d) for d in devices]
  if placement == "balanced":
    sizes = [sum(int(w.numpy().size) for w in layer.weights) for layer in model.layers]
    return dict(zip(layers, [devices[s] for s in balanced_stages(sizes, len(devices))]))
  if isinstance(placement, Mapping):
    named = {_layer_name(k, layers, "parallel.stages"): _canonical(v)
             for k, v in placement.items()}
    current, result = devices[0], {}
    for name in layers:
      current = named.get(name, current)
      result[name] = current
    return result
  if isinstance(placement, Sequence) and not isinstance(placement, str):
    if len(placement) > len(devices):
      raise ConfigError(f"has {len(placement)} stages for {len(devices)} devices ({devices})",
                        key="parallel.stages", received=list(placement))
    stage_of = {}
    for stage, names in enumerate(placement):
      for item in names:
        stage_of[_layer_name(item, layers, "parallel.stages")] = stage
    order = [stage_of[name] for name in layers if name in stage_of]
    if order != sorted(order):
      raise ConfigError("must list contiguous stages, in the model's layer order",
                        key="parallel.stages", received=list(placement))
    result, stage = {}, 0
    for name in layers:  # Unlisted layers (inputs, reshapes) stay with the layer before.
      stage = stage_of.get(name, stage)
      result[name] = devices[stage]
    return result
  raise ConfigError('must be "balanced", a list of stages (lists of layer names) or a map of '
                    "layer names to devices", key="parallel.stages", received=placement)


def balanced_stages(sizes: Sequence[int], stages: int) -> list[int]:
  """The stage of each item: `stages` contiguous runs whose largest sum is the smallest
  possible (the linear partition problem, by dynamic programming). Pure.

  >>> balanced_stages([3, 3, 2, 2, 2], 2)
  [0, 0, 1, 1, 1]
  """
  n = len(sizes)
  prefix = [0]
  for size in sizes:
    prefix.append(prefix[-1] + size)
  stages = max(1, min(stages, n))
  inf = float("inf")
  # best[k][i]: the smallest largest-stage sum of the first i items in k stages.
  best = [[inf] * (n + 1) for _ in range(stages + 1)]
  cut = [[0] * (n + 1) for _ in range(stages + 1)]
  best[0][0] = 0
  for k in range(1, stages + 1):
    for i in range(k, n + 1):
      for j in range(k - 1, i):
        cost = max(best[k - 1][j], prefix[i] - prefix[j])
        if cost < best[k][i]:
          best[k][i], cut[k][i] = cost, j
  result, i = [0] * n, n
  for k in range(stages, 0, -1):
    j = cut[k][i]
    result[j:i] = [k - 1] * (i - j)
    i = j
  return result


def place(model, assignment: Mapping[str, str], recompute: bool = False) -> None:
  """Re-creates each layer's variables on its device (values kept) and runs its `call` there;
  with `recompute`, a layer's activations are not kept for the backward pass but recomputed
  from its inputs (`tf.recompute_grad`).

  The model must be built (a subclassed model: call it once, or `build` it, in `model_fn`).
  """
  for layer in model.layers:
    device = assignment[layer.name]
    if getattr(layer, "tfdist_manages_devices", False):  # A tensor-parallel layer.
      continue
    with tf.init_scope(), tf.device(device):
      for variable in layer.weights:
        variable._initialize(variable.value.read_value())  # A new tf.Variable on `device`.
    layer.call = _on_device(layer.call, device, recompute)


def colocate_optimizer_state(optimizer) -> None:
  """Makes `optimizer` create each slot on its variable's device and run each update there
  (Keras creates slots and update ops on the default device)."""
  create = optimizer.add_variable_from_reference
  update = optimizer.update_step

  def add_variable_from_reference(reference, *args, **kwargs):
    with tf.device(_tf_variable(reference).device):
      return create(reference, *args, **kwargs)

  def update_step(gradient, variable, learning_rate):
    with tf.device(_tf_variable(variable).device):
      return update(gradient, variable, learning_rate)
  optimizer.add_variable_from_reference = add_variable_from_reference
  optimizer.update_step = update_step


def _tf_variable(variable):
  return variable.value if isinstance(variable, keras.Variable) else variable


def stage_devices(assignment: Mapping[str, str]) -> list[str]:
  """The stages' devices, in model order."""
  return list(dict.fromkeys(assignment.values()))


def _on_device(call, device: str, recompute: bool = False):
  @functools.wraps(call)
  def call_on_device(*args, **kwargs):
    with tf.device(device):
      if recompute and args and all(tf.is_tensor(a) for a in args):
        return tf.recompute_grad(lambda *tensors: call(*tensors, **kwargs))(*args)
      return call(*args, **kwargs)
  return call_on_device


def _canonical(device: str) -> str:
  """The full name of `device` ("/device:GPU:1", "GPU:1", "/gpu:1" ...) in this process."""
  names = _local(tf.config.list_logical_devices())
  kind, _, index = str(device).rsplit("/", 1)[-1].removeprefix("device:").rpartition(":")
  for name in names:
    if name.endswith(f"/device:{kind.upper()}:{index}"):
      return name
  raise ConfigError(f"names a device this process does not have; it has: {', '.join(names)}",
                    key="parallel.devices", received=device)


def _layer_name(item, layers: list[str], key: str) -> str:
  if isinstance(item, int) and not isinstance(item, bool):
    if not 0 <= item < len(layers):
      raise ConfigError(f"is no layer index of the model (0 to {len(layers) - 1})", key=key,
                        received=item)
    return layers[item]
  if item not in layers:
    raise ConfigError(f"is no layer of the model; its layers are: {', '.join(layers)}", key=key,
                      received=item)
  return item
