"""`tfdist estimate CONFIG --model module:fn [--batch B] [--length L] [--generate LENGTH]
[--memory 16GiB]`: bytes per device (weights, gradients, optimizer state, the activations the
backward pass keeps, working memory, what the reduction and update hold) of the model's
training step under data parallelism, each ZeRO stage (`tfdist.training.sharding_memory`) and
split over the config's devices, whether it fits the devices, and what to use.
With `--generate`, the same for a causal LM generating sequences of LENGTH tokens: weights,
key/value cache and working memory, on one device and split."""

from __future__ import annotations

import importlib
import os
import re
import sys

from absl import app, flags

from tfdist.cli import flags as cli_flags
from tfdist.config.schema import TaskConfig
from tfdist.errors import ConfigError

FLAGS_DECLARED = (
    cli_flags.Flag("model", "string", None, "The function building the model, as "
                   "module:function (the module imported from the current directory).",
                   metavar="module:function", required=True),
    cli_flags.Flag("batch", "integer", None, "The global batch; default the config's (with "
                   "--generate: the prompts generated at once, default 1).", metavar="B",
                   lower=1),
    cli_flags.Flag("length", "integer", None, "Training: the length each input dimension the "
                   "model leaves open counts at (a sequence's); needed when it leaves one open.",
                   metavar="L", lower=1),
    cli_flags.Flag("generate", "integer", None, "Plan generation, not training, of sequences "
                   "this many tokens long, prompt included (a KerasHub causal LM): weights, "
                   "key/value cache and working memory per device.", metavar="LENGTH", lower=1),
    cli_flags.Flag("memory", "string", None, "Each device's memory, as 16GiB, 512MiB or bytes "
                   "(plan for the devices you will run on); default: this machine's (a GPU's "
                   "memory limit or size, the RAM for CPUs).", metavar="16GiB"),
)
USAGE = cli_flags.usage("estimate", "CONFIG", FLAGS_DECLARED)
FLAGS = flags.FLAGS


def run(args: list[str], task: TaskConfig | None) -> int:
  if len(args) != 1:
    raise app.UsageError(f"usage: {USAGE}")
  from tfdist.config import batch_sizes, load_config
  from tfdist.strategy.devices import configure_devices

  config = load_config(args[0], task=task)
  model_fn = _model_fn(FLAGS.model)
  configure_devices(config.devices)
  from tfdist.parallel import placement, estimates

  devices = list(config.parallel.devices) or placement.stage_devices_here()
  replicas, across = _replicas(config, devices)
  length = FLAGS.generate
  batch = FLAGS.batch or (1 if length else
                          batch_sizes(config.training, replicas).global_batch_size)
  if batch is None:
    raise ConfigError("is needed: pass --batch or set training.global_batch_size",
                      key="--batch")
  capacity = memory_bytes(FLAGS.memory)
  model = model_fn()
  stages = None
  if config.parallel.enabled:
    assignment = placement.assign(model, config.parallel.stages, devices)
    order = placement.stage_devices(assignment)
    stages = [order.index(device) for device in assignment.values()]
  names = ", ".join(d.split("device:")[-1] for d in devices)
  capacity = capacity or estimates.device_capacity(devices[0])
  source = "--memory" if FLAGS.memory else "this machine's"
  if length:
    from tfdist.parallel import generation
    if not generation.is_causal_lm(model):
      raise ConfigError("plans generation with a causal LM (KerasHub's CausalLM: "
                        f"call_with_cache over backbone.transformer_layers); {FLAGS.model} "
                        f"returns a {type(model).__name__}", key="--generate", received=length)
    plan = estimates.estimate_generation(model, batch=batch, length=length, devices=len(devices),
                                   stages=stages)
    print(f"{type(model).__name__} of {model.count_params():,} parameters generating {batch} "
          f"sequence(s) of {length} tokens, {len(devices)} device(s): {names}")
    if capacity:
      print(f"each device: {estimates.readable(capacity)} ({source})")
    print(estimates.render_generation(plan, capacity=capacity))
    return 0
  plan = _training_plan(model, batch, replicas, stages, len(devices))
  shown = f", length {FLAGS.length}" if FLAGS.length else ""
  if across:
    print(f"{type(model).__name__} of {model.count_params():,} parameters, global batch {batch}"
          f" ({batch // replicas} per replica){shown}, {across}; split over this process's "
          f"{len(devices)} device(s): {names}")
  else:
    print(f"{type(model).__name__} of {model.count_params():,} parameters, global batch {batch}"
          f"{shown}, {len(devices)} device(s): {names}")
  if capacity:
    print(f"each device: {estimates.readable(capacity)} ({source})")
  print(estimates.render(plan, capacity=capacity))
  if getattr(model, "optimizer", None) is None:
    print(f"optimizer: not counted: {FLAGS.model} returns a model that is not compiled, so its "
          "optimizer is unknown; compile it there to count its state (Adam keeps 2 bytes per "
          "weight byte, momentum SGD 1)")
  print(estimates.allreduce_table(plan["data_parallel"].gradients,
                                accumulation=config.training.gradient_accumulation_steps))
  print(estimates.gpu_advice(model, batch))
  return 0


def _replicas(config, devices: list[str]) -> tuple[int, str]:
  """The data-parallel replicas to plan for, and how the config makes them ("" when they are
  this process's devices): a cluster's strategy counts its workers (each with this machine's
  GPUs), a local one its devices; one-device strategies plan over `devices` as a what-if."""
  from tfdist.config import strategies
  from tfdist.config.batch import replica_count
  kind = strategies.kind(config.strategy.name)
  if kind.replicas != "workers":
    return len(devices), ""
  gpus = sum("GPU" in d.upper() for d in devices)
  replicas = replica_count(config, local_gpus=gpus)
  workers = max(config.cluster.training_tasks, 1)
  return replicas, (f"{replicas} replica(s): {workers} worker(s) x {max(gpus, 1)} device(s) "
                    f"({config.strategy.name})")


def _training_plan(model, batch: int, replicas: int, stages, devices: int) -> dict:
  from tfdist.parallel import estimates
  from tfdist.parallel.step_memory import open_inputs
  try:
    open_ = open_inputs(model)
  except ValueError as e:  # A subclassed model: no keras.Input to trace the step from.
    raise ConfigError(str(e), key="--model", received=FLAGS.model) from None
  if open_ and FLAGS.length is None:
    raise ConfigError(f"is needed: input {open_[0]!r} of {FLAGS.model} leaves a dimension "
                      "open (a sequence's length): pass the length to count it at",
                      key="--length")
  from tfdist.training import sharding_memory
  # Data parallel over the replicas, each ZeRO stage's; the split over this process's devices.
  plan = estimates.estimate_memory(model, batch=batch, devices=devices, stages=stages,
                                   length=FLAGS.length, replicas=replicas)
  plan.update(sharding_memory.stage_rows(plan))
  plan["refused"] = _refused(model)
  return plan


def _refused(model) -> dict[str, str]:
  """{ZeRO stage row: why the run would refuse it for `model` and its optimizer}."""
  from tfdist.training import sharded_optimizer, sharded_parameters
  optimizer = getattr(model, "optimizer", None)
  if optimizer is None:  # Not compiled: its optimizer is unknown, nothing to refuse yet.
    return {}
  stage_2 = sharded_optimizer.refusal(optimizer, gradients=True)
  reasons = {"sharded": sharded_optimizer.refusal(optimizer), "sharded_gradients": stage_2,
             "sharded_parameters": stage_2 or sharded_parameters.refusal(model, optimizer)}
  return {key: reason for key, reason in reasons.items() if reason}


_UNITS = {"": 1, "b": 1, "k": 2 ** 10, "kib": 2 ** 10, "m": 2 ** 20, "mib": 2 ** 20,
          "g": 2 ** 30, "gib": 2 ** 30, "t": 2 ** 40, "tib": 2 ** 40}


def memory_bytes(text: str | None) -> int | None:
  """Bytes of "16GiB", "512 MiB", "1.5G" or "1048576" (binary units). Pure.

  >>> memory_bytes("512MiB")
  536870912
  """
  if text is None:
    return None
  match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
  if not match or match.group(2).lower() not in _UNITS or float(match.group(1)) <= 0:
    raise ConfigError("must be a size such as 16GiB, 512MiB or a number of bytes",
                      key="--memory", received=text)
  return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


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
