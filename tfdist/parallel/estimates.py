"""How much memory each device needs under each way of training a model, or generating with a
causal LM, and which way fits.

Training, per device, in bytes: weights, gradients (one per trainable weight), optimizer state
(the optimizer's own slots, counted by building a copy of it on the model's variables),
activations (what the backward pass keeps: read from the traced training step,
`step_memory.step_tensors`, so a recurrent layer's every time step, attention's scores and the
loss's logits count) and working memory (what one op, or the optimizer's update, holds at once
on top of that), then what the gradients' reduction and the optimizer's update hold beside the
gradients once the passes have freed theirs (`DeviceMemory.update`). Data parallelism
(mirrored, multi_worker_mirrored) holds everything on every device with the batch split; a
split holds each stage's share with the whole batch going through.

Generation (`estimate_generation`), per device: weights, the key/value cache of its blocks, and
the working memory of the first pass over the prompts (twice the largest layer output).

```python
plan = estimate_memory(model, batch=256, devices=2)
print(render(plan, capacity=16 << 30))
```
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
  """Bytes one device holds.

  A step holds its gradients throughout two phases: the forward and backward passes (the
  activations they keep and their working memory), then the gradients' reduction and the
  optimizer's update (`update`), which begin once the backward pass has freed the first.
  `total` is the larger phase's peak with the variables.

  Attributes:
    weights: the model's variables.
    gradients: one per trainable weight.
    optimizer: the optimizer's slots.
    activations: the forward tensors the backward pass keeps.
    working: what the passes hold at once on top of that (`StepTensors.working`; under
      stage 3 the weights gathered for them too).
    update: what the reduction and the update hold at once beside the gradients (across
      replicas, the all-reduce's packed buffer; a ZeRO stage's shards, pieces and copies:
      `tfdist.training.sharding_memory`).
  """
  weights: int
  gradients: int
  optimizer: int
  activations: int
  working: int = 0
  update: int = 0

  @property
  def variables(self) -> int:
    """Weights and optimizer state: what `tf.Variable`s hold (measurable on any device)."""
    return self.weights + self.optimizer

  @property
  def total(self) -> int:
    return (self.weights + self.optimizer + self.gradients +
            max(self.activations + self.working, self.update))


def layer_bytes(model, kept: dict) -> list[dict]:
  """Per unit of `model` (`placement.units`: nested models opened): its name, weight,
  trainable and activation bytes (`kept`: what the backward pass keeps of its ops,
  `step_memory.StepTensors.by_unit`), then a last row, "(loss and inputs)", for the loss's and
  the inputs' kept tensors."""
  from tfdist.parallel.placement import units
  from tfdist.parallel.step_memory import LOSS_AND_INPUTS

  rows = []
  for name, layer in units(model).items():
    rows.append({"name": name, "weights": sum(_bytes(w) for w in layer.weights),
                 "trainable": sum(_bytes(w) for w in layer.trainable_weights),
                 "activations": kept.get(name, 0)})
  return rows + [{"name": LOSS_AND_INPUTS, "weights": 0, "trainable": 0,
                  "activations": kept.get(LOSS_AND_INPUTS, 0)}]


def output_bytes(model, batch: int, length: int = 1) -> list[dict]:
  """Per unit of `model`: its name, weight bytes and "activations", its output for `batch`
  examples in the model's compute dtype (a dimension the model leaves open counts `length`):
  what an inference pass holds of it."""
  from tfdist.parallel.placement import units

  rows = []
  for name, layer in units(model).items():
    outputs = getattr(layer, "output", None) if _has_output(layer) else None
    width = 0 if outputs is None else sum(
        int(np.prod([length if d is None else d for d in o.shape[1:]])) for o in _flat(outputs))
    itemsize = np.dtype(keras.backend.standardize_dtype(layer.compute_dtype)).itemsize
    rows.append({"name": name, "weights": sum(_bytes(w) for w in layer.weights),
                 "activations": width * batch * itemsize})
  return rows


def slots_per_weight(optimizer) -> float:
  """The optimizer state's bytes per trainable weight byte, counted on a copy built on a small
  variable (Adam: 2, SGD with momentum: 1, plain SGD: 0)."""
  if optimizer is None:
    return 0.0
  copy = optimizer.__class__.from_config(optimizer.get_config())
  probe = keras.Variable(np.zeros((4, 4), np.float32))
  copy.build([probe])
  state = sum(_bytes(v) for v in copy.variables if tuple(v.shape) == (4, 4))
  return state / _bytes(probe)


def estimate_memory(model, batch: int, devices: int, stages: list[int] | None = None,
                    length: int | None = None, replicas: int | None = None) -> dict:
  """{"data_parallel": DeviceMemory per device, "split": [DeviceMemory per stage]}.

  Args:
    model: a built functional or Sequential Keras model (its optimizer, when compiled, sets the
      state per weight; its loss, the loss's kept tensors).
    batch: the global batch.
    devices: the devices to train on.
    stages: each unit's stage (`placement.units`; default: `balanced_stages` of the weights
      over `devices`).
    length: the size of each input dimension the model leaves open (a sequence's length);
      needed when it leaves one open.
    replicas: the data-parallel replicas (a cluster's, over its workers); default `devices`.

  Returns:
    A dict: "data_parallel" (the `DeviceMemory` of each replica, its batch `batch / replicas`),
    "split" (one `DeviceMemory` per stage, a worker's whole batch through each: `batch` over
    the workers, `replicas / devices`), "stages" (each unit's stage), "layers" (their names),
    "replicas", "trainable" (the trainable weights' bytes) and "largest" (the largest trainable
    weight's); `tfdist.training.sharding_memory.stage_rows` adds the ZeRO stages' rows from
    them; `render` prints it.

  Raises:
    ValueError: the model leaves an input dimension open and `length` is None.

  Example:

  ```python
  import keras
  from tfdist.parallel import estimate_memory
  from tfdist.parallel.estimates import render
  model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(1024),
                            keras.layers.Dense(10)])
  model.compile(optimizer="adam", loss="mse")
  estimate = estimate_memory(model, batch=256, devices=2)
  print(render(estimate, capacity=16 << 30))
  ```
  """
  from tfdist.parallel.placement import balanced_stages
  from tfdist.parallel.step_memory import step_tensors

  replicas = replicas or devices
  workers = max(1, replicas // devices)  # Each splits its model over its devices.
  whole = step_tensors(model, max(1, batch // workers), length)
  rows = layer_bytes(model, whole.by_unit)
  units, loss = rows[:-1], rows[-1]
  ratio = slots_per_weight(getattr(model, "optimizer", None))
  stages = stages or balanced_stages([r["weights"] for r in units], devices)
  replica = step_tensors(model, max(1, batch // replicas), length) if replicas > workers \
      else whole

  def memory(selected, activations: int, step, gradients=None) -> DeviceMemory:
    trainable = sum(r["trainable"] for r in selected)
    return DeviceMemory(weights=sum(r["weights"] for r in selected),
                        gradients=trainable if gradients is None else gradients,
                        optimizer=int(round(trainable * ratio)), activations=activations,
                        working=step.working)
  last = max(stages)
  split = [memory(chosen, sum(r["activations"] for r in chosen) +
                  (loss["activations"] if k == last else 0), whole)
           for k in range(last + 1)
           for chosen in [[r for r, s in zip(units, stages) if s == k]]]
  data_parallel = dataclasses.replace(  # Keras's all-reduce packs the gradients in one buffer.
      memory(units, replica.kept, replica, replica.gradients),
      update=replica.gradients if replicas > 1 else 0)
  trainable = model.trainable_variables
  return {"data_parallel": data_parallel, "split": split, "stages": stages,
          "layers": [r["name"] for r in units], "replicas": replicas,
          "trainable": sum(_bytes(v) for v in trainable),
          "largest": max((_bytes(v) for v in trainable), default=0)}


# The ZeRO stages' rows (`tfdist.training.sharding_memory.stage_rows`), in the order printed and
# tried (the first that fits is recommended): key, table label, words, the settings turning it on.
STAGE_ROWS = (
    ("sharded", "  optimizer sharded", "the optimizer's state sharded",
     "training.zero_stage: 1"),
    ("sharded_gradients", "  + gradients sharded",
     "the optimizer's state and the gradients sharded", "training.zero_stage: 2"),
    ("sharded_parameters", "  + weights sharded", "the weights sharded too",
     "training.zero_stage: 3"),
)


def recommend(plan: dict, capacity: int | None) -> str:
  """Which way fits a device of `capacity` bytes (None: unknown): data parallel, then each ZeRO
  stage the plan has (a stage in `plan["refused"]` is passed over, its reason said), then the
  split. Pure."""
  data, split = plan["data_parallel"], plan["split"]
  if capacity is None:
    return "device memory unknown: compare the totals with your devices"
  if data.total <= capacity:
    return "data parallel: the whole model fits each device (strategy mirrored or " \
           "multi_worker_mirrored)"
  refused = plan.get("refused", {})
  fitting = [(key, words, settings) for key, _, words, settings in STAGE_ROWS
             if key in plan and plan[key].total <= capacity]
  passed_over = [f"{words} would fit, but {settings} refuses this model: {refused[key]}"
                 for key, words, settings in fitting if key in refused]
  chosen = [row for row in fitting if row[0] not in refused]
  if chosen:
    key, words, settings = chosen[0]
    only = " (no stage before it does)" if len(fitting) == 1 and key == STAGE_ROWS[-1][0] \
        else ""
    return (f"data parallel with {words} ({settings}) fits{only}: "
            f"{_mib(plan[key].total)} each, {_mib(data.total - plan[key].total)} less than "
            "unsharded")
  said = "; ".join(passed_over)
  if max(m.total for m in split) <= capacity:
    return (f"split into {len(split)} stages (parallel: {{stages: balanced}}); the whole model "
            "does not fit one device" + (f" ({said})" if said else ""))
  return ("does not fit: more devices, a smaller batch, parallel.microbatches with fewer "
          "activations, or bfloat16" + (f" ({said})" if said else ""))


@dataclasses.dataclass(frozen=True)
class GenerationMemory:
  """Bytes one device holds while a causal LM generates. Attributes: weights, cache (the
  key/value cache of its blocks), activations (the first pass's working memory, estimated)."""
  weights: int
  cache: int
  activations: int

  @property
  def total(self) -> int:
    return self.weights + self.cache + self.activations


def estimate_generation(model, batch: int, length: int, devices: int,
                    stages: list[int] | None = None) -> dict:
  """{"unsplit": GenerationMemory on one device, "split": [GenerationMemory per stage]} for a
  KerasHub causal LM generating `batch` sequences of up to `length` tokens.

  Args:
    model: a KerasHub causal LM (`generation.is_causal_lm`), not yet split.
    batch: the prompts generated at once.
    length: the longest sequence, prompt included (`generate`'s `max_length`).
    devices: the devices to split over.
    stages: each unit's stage (default: `balanced_stages` of the weights over `devices`).

  Returns:
    The plan, with "stages" and "layers" (unit names) as `estimate_memory` gives them.

  Example:

  ```python
  import keras_hub
  from tfdist.parallel import estimate_generation
  from tfdist.parallel.estimates import render_generation
  backbone = keras_hub.models.GPT2Backbone(vocabulary_size=1000, num_layers=4, num_heads=4,
                                           hidden_dim=64, intermediate_dim=128,
                                           max_sequence_length=256)
  causal_lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
  estimate = estimate_generation(causal_lm, batch=4, length=256, devices=2)
  print(render_generation(estimate, capacity=16 << 30))
  ```
  """
  from tfdist.parallel import generation, placement

  rows = output_bytes(model, batch, length)
  stages = stages or placement.balanced_stages([r["weights"] for r in rows], devices)
  position = {id(layer): i for i, layer in enumerate(placement.units(model).values())}
  cache_of = dict(zip([position[id(b)] for b in model.backbone.transformer_layers],
                      generation.cache_bytes(model, batch, length)))

  def memory(selected: list[int]) -> GenerationMemory:
    return GenerationMemory(weights=sum(rows[i]["weights"] for i in selected),
                            cache=sum(cache_of.get(i, 0) for i in selected),
                            activations=2 * max([rows[i]["activations"] for i in selected],
                                                default=0))
  split = [memory([i for i, s in enumerate(stages) if s == k]) for k in range(max(stages) + 1)]
  return {"unsplit": memory(list(range(len(rows)))), "split": split, "stages": stages,
          "layers": [r["name"] for r in rows]}


def recommend_generation(plan: dict, capacity: int | None) -> str:
  """Whether generation fits one device of `capacity` bytes, or the split. Pure."""
  one, split = plan["unsplit"].total, max(m.total for m in plan["split"])
  if capacity is None:
    return "device memory unknown: compare the totals with your devices (--memory)"
  if one <= capacity:
    return f"fits one device ({readable(one)} of {readable(capacity)}): no split needed"
  if split <= capacity:
    return (f"does not fit one device ({readable(one)} > {readable(capacity)}); fits "
            f"{len(plan['split'])} split (largest stage {readable(split)}): parallel: "
            "{stages: balanced}, or tfdist.parallel.split(model, \"balanced\")")
  return (f"does not fit {len(plan['split'])} devices either (largest stage "
          f"{readable(split)} > {readable(capacity)}): more devices, fewer or shorter "
          "sequences, or a half-precision dtype")


def render_generation(plan: dict, capacity: int | None = None) -> str:
  """The generation plan as a table, then the recommendation. Pure."""
  lines = [f"{'':24}{'weights':>12}{'kv cache':>12}{'activations':>13}{'total':>12}"]
  for name, m in [("one device", plan["unsplit"])] + [
      (f"split, stage {k}", m) for k, m in enumerate(plan["split"])]:
    lines.append(f"{name:24}{_mib(m.weights):>12}{_mib(m.cache):>12}{_mib(m.activations):>13}"
                 f"{_mib(m.total):>12}")
  lines.append(recommend_generation(plan, capacity))
  return "\n".join(lines)


def render(plan: dict, capacity: int | None = None) -> str:
  """The plan as a table, then the recommendation. Pure."""
  lines = [f"{'':24}{'weights':>12}{'gradients':>12}{'optimizer':>12}{'activations':>13}"
           f"{'working':>12}{'update':>12}{'total':>12}"]

  def row(name, m: DeviceMemory):
    lines.append(f"{name:24}{_mib(m.weights):>12}{_mib(m.gradients):>12}"
                 f"{_mib(m.optimizer):>12}{_mib(m.activations):>13}{_mib(m.working):>12}"
                 f"{_mib(m.update):>12}{_mib(m.total):>12}")
  row("data parallel, each", plan["data_parallel"])
  for key, label, *_ in STAGE_ROWS:
    if key in plan:
      row(label, plan[key])
  for k, m in enumerate(plan["split"]):
    row(f"split, stage {k}", m)
  lines.append("total: weights + gradients + optimizer + the larger of activations + working "
               "(the passes) and update (the reduction and the optimizer's update)")
  lines.append(recommend(plan, capacity))
  return "\n".join(lines)


def _mib(n: int) -> str:
  return f"{n / 2 ** 20:.2f} MiB"


def readable(n: int) -> str:
  """`n` bytes in GiB, or in MiB below one GiB."""
  return f"{n / 2 ** 30:.2f} GiB" if n >= 2 ** 30 else _mib(n)


def _bytes(variable) -> int:
  return int(np.prod(variable.shape)) * np.dtype(keras.backend.standardize_dtype(
      variable.dtype)).itemsize


def _has_output(layer) -> bool:
  try:
    return layer.output is not None
  except (AttributeError, ValueError):  # A subclassed model's layers have no symbolic output.
    return False


def _flat(outputs):
  return outputs if isinstance(outputs, (list, tuple)) else [outputs]


def device_capacity(device: str) -> int | None:
  """Bytes of `device`: a logical GPU's memory limit (`devices.gpu_memory`, `logical_gpus`),
  else its GPU's from nvidia-smi (TensorFlow reports usage, not size); a CPU's the machine's
  RAM (logical CPUs share it); None when unknown."""
  import os

  from tfdist.machine import facts

  if "GPU" in device.upper():
    index = int(device.rsplit(":", 1)[-1])
    limit = _logical_gpu_limits()
    if index < len(limit) and limit[index] is not None:
      return limit[index] << 20
    mib = facts.gpu_memory_mib(str(index))
    return None if mib is None else mib << 20
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _logical_gpu_limits() -> list[int | None]:
  """Each logical GPU's memory limit in MiB, in TensorFlow's order (None: the whole GPU)."""
  import tensorflow as tf

  limits: list[int | None] = []
  for gpu in tf.config.list_physical_devices("GPU"):
    configs = tf.config.get_logical_device_configuration(gpu)
    limits += [c.memory_limit for c in configs] if configs else [None]
  return limits


def gpu_advice(model, batch: int, repeats: int = 10) -> str:
  """Whether a GPU pays off for this model and batch: the measured time to copy a batch of
  inputs to the GPU against a forward and backward pass there (written for GPUs; a machine
  without one says so)."""
  import time

  import tensorflow as tf

  if not tf.config.list_logical_devices("GPU"):
    return "no GPU here: nothing to compare a host-to-device copy with"
  shape = (batch, *model.input_shape[1:])
  host = np.random.random(shape).astype(np.float32)

  def timed(fn) -> float:
    fn()  # Warm up (and trace).
    start = time.perf_counter()
    for _ in range(repeats):
      fn()
    return (time.perf_counter() - start) / repeats

  with tf.device("/device:GPU:0"):
    copy = timed(lambda: tf.identity(tf.constant(host)).numpy())
    on_gpu = tf.constant(host)

    @tf.function
    def step():
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.cast(model(on_gpu, training=True), tf.float32))
      return tape.gradient(loss, model.trainable_weights)
    compute = timed(lambda: [g.numpy() for g in step() if g is not None])
  verdict = ("the GPU would mostly wait for data: use a larger batch or a bigger model, keep the "
             "data on the GPU, or train on the CPU" if copy > compute else
             "the GPU pays off: a step outweighs the copy of its batch")
  return (f"GPU: copying a batch of {batch} takes {1000 * copy:.2f} ms, a forward and backward "
          f"pass {1000 * compute:.2f} ms: {verdict}")


LINK_BYTES_PER_SECOND = 12.5e9  # 100 Gb/s (InfiniBand EDR, a 100 GbE NIC): the table's default.


def allreduce_seconds(gradient_bytes: int, devices: int,
                      bytes_per_second: float = LINK_BYTES_PER_SECOND,
                      latency_seconds: float = 0.0) -> float:
  """A ring all-reduce's time, T = 2(N-1) a + 2(N-1)/N x bytes / b: 2(N-1) ring steps of
  latency a each, and nccl-tests' bus-bandwidth term over the slowest link b. Pure.

  >>> round(allreduce_seconds(7_454_760, 8), 6)
  0.001044
  >>> round(allreduce_seconds(7_454_760, 2, 170e6, 0.001), 4)  # gRPC on one host (issue 25)
  0.0459
  """
  return (2 * (devices - 1) * latency_seconds
          + 2 * (devices - 1) / devices * gradient_bytes / bytes_per_second)


def fit_ring(points) -> tuple[float, float]:
  """(a seconds per ring step, b bytes per second) of the ring model fitted to measured
  (devices, bytes, seconds) all-reduces: least squares of the relative error (a 4 KiB and a
  16 MiB all-reduce weigh alike), a kept >= 0. Pure.

  >>> a, b = fit_ring([(2, 0, 0.002), (2, 170e6, 1.002), (4, 0, 0.006)])
  >>> round(a, 6), round(b / 1e6)
  (0.001, 170)
  """
  import numpy as np
  rows = np.array([[2 * (n - 1), 2 * (n - 1) / n * size] for n, size, _ in points], float)
  seconds = np.array([t for *_, t in points], float)
  (a, inverse_b), *_ = np.linalg.lstsq(rows / seconds[:, None], np.ones(len(seconds)),
                                       rcond=None)
  if a < 0:  # Latency hidden in the noise: bandwidth alone.
    a = 0.0
    inverse_b = float(np.sum(rows[:, 1] / seconds) / np.sum((rows[:, 1] / seconds) ** 2))
  return float(a), float(1 / inverse_b) if inverse_b > 0 else float("inf")


def allreduce_table(gradient_bytes: int, compute_seconds: float | None = None,
                    accumulation: int = 1, devices=(8, 64, 512),
                    bytes_per_second: float = LINK_BYTES_PER_SECOND,
                    latency_seconds: float = 0.0) -> str:
  """The all-reduce's time per step at each device count, and (with the step's compute time)
  the weak-scaling efficiency it allows with no overlap: compute / (compute + all-reduce), the
  all-reduce's share divided by `accumulation` (one all-reduce per update). Pure."""
  latency = (f"2(N-1) x {1e3 * latency_seconds:.2f} ms + " if latency_seconds else "")
  lines = [f"all-reduce of {gradient_bytes / 2 ** 20:.1f} MiB of gradients at "
           f"{bytes_per_second * 8 / 1e9:.2f} Gb/s, {latency}2(N-1)/N x bytes / bandwidth:"]
  for n in devices:
    seconds = allreduce_seconds(gradient_bytes, n, bytes_per_second,
                                latency_seconds) / accumulation
    line = f"  {n:>4} devices: {1000 * seconds:.2f} ms a step"
    if compute_seconds:
      line += f", efficiency <= {compute_seconds / (compute_seconds + seconds):.2f}"
    lines.append(line)
  return "\n".join(lines)
