"""Which device each layer of a model lives on, and putting it there.

Keras 3 gives nothing for this on TensorFlow: `keras.distribution.ModelParallel` builds, fits
and places every weight, full size, on one device (its TensorFlow backend is a prototype,
keras-team/keras#18473). A layer built under `tf.device(D)` has its variables on D, but Keras's
`fit` runs its ops on the default device; so `place` does both: it re-creates each layer's
variables on its device and runs the layer's `call` under that device.

The units placed are the model's layers with nested functional models opened down to their
own layers (a KerasHub task model's backbone down to its transformer blocks); a layer that
appears twice (a tied embedding used again as the head) is one unit, placed where it first
appears. A subclassed model inside a model stays one unit: its layers' order is not data order.

A placement is one of:
  - stages: a list per device of unit names or indices, contiguous and in order (a nested
    model's name stands for all its units);
  - a map {unit name: device}; a unit not named stays with the unit before it;
  - "balanced": contiguous stages with parameter counts as even as they can be.

```python
assignment = assign(model, "balanced", ["/device:GPU:0", "/device:GPU:1"])
place(model, assignment)
```
"""

from __future__ import annotations

import collections
import functools
from typing import Any, Mapping, Sequence

import keras
import tensorflow as tf

from tfdist.errors import ConfigError


def stage_devices_here() -> list[str]:
  """This process's devices for stages: its GPUs, else its (logical) CPUs."""
  gpus = _local(tf.config.list_logical_devices("GPU"))
  return gpus or _local(tf.config.list_logical_devices("CPU"))


def _local(devices) -> list[str]:
  """The names of `devices` on this task (in a cluster TensorFlow lists every task's)."""
  from tensorflow.python.eager import context
  host = context.context().host_address_space()
  return [d.name for d in devices
          if d.name.startswith(host + "/") or not d.name.startswith("/job:")]


def units(model) -> dict[str, Any]:
  """{name: layer} of the units `model` is placed in, in data order: its layers, each nested
  functional or Sequential model opened down to its own layers, a layer seen twice kept once.
  A name two units share is given its model's path ("backbone/token_ids").

  ```python
  list(units(gpt2_causal_lm))[:3]  # ['padding_mask', 'token_ids', 'token_embedding']
  ```
  """
  return _walk(model)[0]


def nested_models(model) -> dict[str, list[str]]:
  """{name of a nested model that `units` opens: the names of its units}."""
  return _walk(model)[1]


def _walk(model) -> tuple[dict[str, Any], dict[str, list[str]]]:
  """(`units`, `nested_models`) of `model`, from one walk of its layers."""
  found: list[tuple[tuple[str, ...], Any]] = []  # (the nested models it is in, a layer)
  seen: set[int] = set()

  def visit(layers, parents: tuple[str, ...]) -> None:
    for layer in layers:
      if id(layer) in seen:
        continue
      seen.add(id(layer))
      if _opens(layer):
        visit(layer.layers, parents + (layer.name,))
      else:
        found.append((parents, layer))
  visit(model.layers, ())
  counts = collections.Counter(layer.name for _, layer in found)
  placed: dict[str, Any] = {}
  nested: dict[str, list[str]] = {}
  for parents, layer in found:
    name = layer.name if counts[layer.name] == 1 else "/".join(parents + (layer.name,))
    placed[name] = layer
    for parent in parents:
      nested.setdefault(parent, []).append(name)
  return placed, nested


def _opens(layer) -> bool:
  from keras.src.models.functional import Functional  # Sequential builds one inside.
  return isinstance(layer, (Functional, keras.Sequential)) and bool(layer.layers)


def assign(model, placement: Any, devices: Sequence[str]) -> dict[str, str]:
  """{unit name: device} for every unit of `model` (`units(model)`, in order).

  Args:
    model: a built Keras model.
    placement: "balanced", a list per device of unit names or indices, or {unit name: device}.
    devices: the devices, in stage order.

  Returns:
    Each unit's device, in the model's data order.

  Raises:
    ConfigError: a device that does not exist, a layer the model lacks, stages out of order.

  ```python
  assign(model, "balanced", ["/device:GPU:0", "/device:GPU:1"])
  ```
  """
  placed, nested = _walk(model)
  layers = list(placed)
  devices = [_canonical(d) for d in devices]
  if placement == "balanced":
    sizes = [sum(int(w.numpy().size) for w in layer.weights) for layer in placed.values()]
    return dict(zip(layers, [devices[s] for s in balanced_stages(sizes, len(devices))]))
  if isinstance(placement, Mapping):
    named = {name: _canonical(v) for k, v in placement.items()
             for name in _layer_names(k, layers, nested, "parallel.stages")}
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
        for name in _layer_names(item, layers, nested, "parallel.stages"):
          stage_of[name] = stage
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
  for name, layer in units(model).items():
    device = assignment[name]
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


def _layer_names(item, layers: list[str], nested: dict[str, list[str]], key: str) -> list[str]:
  """The units `item` (a unit's name or index, or a nested model's name) stands for."""
  if isinstance(item, int) and not isinstance(item, bool):
    if not 0 <= item < len(layers):
      raise ConfigError(f"is no layer index of the model (0 to {len(layers) - 1})", key=key,
                        received=item)
    return [layers[item]]
  if item in layers:
    return [item]
  if item in nested:
    return nested[item]
  models = f"; its nested models: {', '.join(nested)}" if nested else ""
  raise ConfigError(f"is no layer of the model; its layers are: {', '.join(layers)}{models}",
                    key=key, received=item)
