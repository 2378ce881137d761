"""`tfdist plan CONFIG --model module:fn [--batch B]`: bytes per device (weights, gradients,
optimizer state, activations) of the model under data parallelism and split over the config's
devices, whether it fits this machine's devices, and what to use."""

from __future__ import annotations

import importlib
import os
import sys

from absl import flags

from tfdist.errors import ConfigError

USAGE = "tfdist plan CONFIG --model module:function [--batch B]"
FLAGS = flags.FLAGS


def run(args: list[str], task: str | None) -> int:
  if len(args) != 1:
    raise SystemExit(f"usage: {USAGE}")
  from tfdist.config import batch_sizes, load_config
  from tfdist.strategy.devices import configure_devices

  config = load_config(args[0], task=task)
  model_fn = _model_fn(FLAGS.model)
  configure_devices(config.devices)
  from tfdist.parallel import placement, planner

  devices = list(config.parallel.devices) or placement.local_devices()
  batch = FLAGS.batch or batch_sizes(config.training, 1).global_batch_size
  if batch is None:
    raise ConfigError("is needed: pass --batch or set training.global_batch_size",
                      key="--batch", received=None)
  model = model_fn()
  stages = None
  if config.parallel.enabled:
    assignment = placement.assign(model, config.parallel.stages, devices)
    order = placement.stage_devices(assignment)
    stages = [order.index(assignment[layer.name]) for layer in model.layers]
  plan = planner.plan_memory(model, batch=batch, devices=len(devices), stages=stages)
  print(f"{type(model).__name__} of {model.count_params():,} parameters, global batch {batch}, "
        f"{len(devices)} device(s): {', '.join(d.split('device:')[-1] for d in devices)}")
  capacity = planner.device_capacity(devices[0])
  if capacity:
    print(f"each device: {capacity / 2 ** 30:.1f} GiB")
  print(planner.render(plan, capacity=capacity))
  if getattr(model, "optimizer", None) is None:
    print(f"optimizer: not counted: {FLAGS.model} returns a model that is not compiled, so its "
          "optimizer is unknown; compile it there to count its state (Adam keeps 2 bytes per "
          "weight byte, momentum SGD 1)")
  print(planner.allreduce_table(plan["data_parallel"].gradients,
                                accumulation=config.training.gradient_accumulation_steps))
  print(planner.gpu_advice(model, batch))
  return 0


def _model_fn(spec: str | None):
  if not spec or ":" not in spec:
    raise ConfigError("must be module:function, the function that builds the model",
                      key="--model", received=spec)
  module, _, name = spec.partition(":")
  sys.path.insert(0, os.getcwd())
  try:
    return getattr(importlib.import_module(module), name)
  except (ImportError, AttributeError) as e:
    raise ConfigError(f"cannot be loaded ({e})", key="--model", received=spec) from None
