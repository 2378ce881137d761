"""`tfdist.parallel.split` (`from tfdist.parallel import split`): one Keras model split over
this process's devices.

Each layer's variables and ops go to its stage's device, the optimizer's slots and updates
with their variables, gradients with their forward ops; activations cross devices only where a
stage ends. From YAML, `tfdist.fit` does the same for `model_fn`'s model:

```yaml
parallel:
  stages: balanced            # or [[conv1, conv2], [lstm, dense]], or {lstm: /device:CPU:0}
  devices: [/device:GPU:0, /device:GPU:1]   # default: this process's GPUs, else its CPUs
  microbatches: 4             # GPipe: stages overlap on micro-batches
  recompute: false            # true: recompute each layer's activations in the backward pass
```

```python
model = split(model, [["dense", "dense_1"], ["dense_2"]],
              devices=["/device:GPU:0", "/device:GPU:1"], microbatches=4)
model.fit(x, y)
```
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

from tfdist.errors import ConfigError, ModelError
from tfdist.parallel import generation, pipeline, placement


def split(model, stages: Any = "balanced", *, devices: Sequence[str] | None = None,
          microbatches: int = 1, recompute: bool = False, reduce_gradients=None):
  """Splits the built `model` over `devices`, in place, and returns it.

  Args:
    model: a built Keras model: Sequential, functional, or subclassed (built by calling it once
      or `build`). Its units are its layers in the order the data runs through, nested
      functional models opened down to their layers (`placement.units`). A KerasHub causal LM
      also generates split: each block's key/value cache stays on the block's device
      (`generation.prepare`).
    stages: "balanced", a list per device of layer names or indices, or {layer name: device}.
    devices: the devices, in stage order; default: this process's GPUs, else its CPUs.
    microbatches: parts each batch is split into, run as a pipeline; for `generate`, groups
      of prompts, each its own sampling loop.
    recompute: keep no activations inside a layer for the backward pass; recompute them from
      the layer's input (less memory, one more forward pass).
    reduce_gradients: a function of (gradients, variables) run before each update
      (`hybrid.Hybrid.mean_gradients` averages them across workers).

  Raises:
    ModelError: `jit_compile=True` where Keras's "auto" would not turn it on (XLA cannot
      reach variables on another device; where "auto" turns it on, on a GPU, it is turned off
      with a notice).
    ConfigError: an unknown device or layer, stages out of order.

  Returns:
    `model`, split.

  Example:

  ```python
  import keras
  import numpy as np
  from tfdist.parallel import split
  model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, activation="relu"),
                            keras.layers.Dense(64, activation="relu"), keras.layers.Dense(1)])
  model = split(model, "balanced", devices=["/device:CPU:0", "/device:CPU:1"],
                microbatches=2)   # GPUs: ["/device:GPU:0", "/device:GPU:1"]
  model.compile(optimizer="adam", loss="mse")
  model.fit(np.random.rand(64, 16), np.random.rand(64, 1), batch_size=16, verbose=0)
  ```

  A KerasHub causal LM generates split the same way:
  `split(causal_lm, "balanced", devices=[...])`, then `causal_lm.generate(...)`.
  """
  if model.jit_compile is True:
    if not model._resolve_auto_jit_compile():  # Asked for: Keras's "auto" is off here.
      raise ModelError("jit_compile: cannot be true on a model split over devices: XLA "
                       "compiles for one device and cannot reach variables on another; compile "
                       "it without jit_compile. Received: jit_compile=True")
    # Keras's default jit_compile="auto" turns XLA on where a GPU is present, and a compiled
    # model no longer says whether it was asked for: a split model runs without it.
    print("tfdist: jit_compile off for the model split over devices (Keras's \"auto\" "
          "turned it on: XLA compiles for one device and cannot reach another's variables)",
          flush=True)
  if not model.built:
    raise ConfigError("a model must be built before it is split (call it on a batch or "
                      "`model.build(input_shape)` in model_fn)", key="parallel",
                      received=type(model).__name__)
  if microbatches < 1:
    raise ConfigError("must be 1 or greater", key="parallel.microbatches", received=microbatches)
  devices = list(devices or placement.stage_devices_here())
  assignment = placement.assign(model, stages, devices)
  placement.place(model, assignment, recompute)
  model.jit_compile = False  # Keras's "auto" turns XLA on when a GPU is present.
  last = placement.stage_devices(assignment)[-1]
  model.train_step = functools.partial(pipeline.train_step, model, microbatches=microbatches,
                                       last_device=last, reduce_gradients=reduce_gradients)
  model.predict_step = functools.partial(pipeline.predict_step, model,
                                         microbatches=microbatches)
  model.tfdist_placement = assignment
  if generation.is_causal_lm(model):
    generation.prepare(model, assignment, microbatches)
  if getattr(model, "optimizer", None) is not None:  # An uncompiled model has none.
    _colocate(model)
  compile = model.compile

  @functools.wraps(compile)
  def compile_colocated(*args, **kwargs):  # A model compiled after its split.
    compile(*args, **kwargs)
    if kwargs.get("jit_compile") is True:
      print("tfdist: jit_compile=True turned off: the model is split over devices, and XLA "
            "compiles for one device and cannot reach another's variables", flush=True)
    model.jit_compile = False
    _colocate(model)
  model.compile = compile_colocated
  return model


def _colocate(model) -> None:
  optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)
  if optimizer.built:
    raise ConfigError("was built before the split, its slots on one device: split the model "
                      "before its first step", key="optimizer", received=type(optimizer).__name__)
  placement.colocate_optimizer_state(optimizer)


def describe(assignment: dict, microbatches: int) -> str:
  """The start-of-fit line of a split model. Pure.

  >>> describe({"a": "/device:CPU:0", "b": "/device:CPU:0", "c": "/device:CPU:1"}, 4)
  'tfdist: model split into 2 stages (a, b on CPU:0 | c on CPU:1), 4 micro-batches'

  A stage of more than three layers is named by its first and last: "l0 ... l4, 5 layers".
  """
  stages = {}
  for layer, device in assignment.items():
    stages.setdefault(device, []).append(layer)

  def names(layers: list) -> str:
    return (", ".join(layers) if len(layers) <= 3 else
            f"{layers[0]} ... {layers[-1]}, {len(layers)} layers")
  parts = " | ".join(f"{names(layers)} on {device.split('device:')[-1]}"
                     for device, layers in stages.items())
  return (f"tfdist: model split into {len(stages)} stage{'s' * (len(stages) != 1)} ({parts}), "
          f"{microbatches} micro-batch{'es' * (microbatches != 1)}")
