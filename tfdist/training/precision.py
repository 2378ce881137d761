"""Mixed precision: which Keras dtype policy the config's `training.mixed_precision` means on
this machine, applied while the model is built, with the output layers kept in float32.
"""

from __future__ import annotations

import contextlib
import pathlib
from typing import Iterable, Sequence

_BF16_CPU_FLAGS = {"amx_bf16", "avx512_bf16"}
FLOAT32 = "float32"
BFLOAT16 = "mixed_bfloat16"
FLOAT16 = "mixed_float16"


def choose_policy(mode: str, cpu_flags: Iterable[str] = (),
                  gpu_capabilities: Sequence[tuple[int, int]] = (),
                  loss_scaling: bool = True) -> str:
  """The Keras dtype policy for `mode` (off, auto, bfloat16, float16).

  `auto` is bfloat16 on GPUs of compute capability 8.0 or newer, float16 (Keras adds loss
  scaling) on 7.x where the strategy allows `loss_scaling`, float32 on other GPUs; without a
  GPU, bfloat16 on CPUs with AMX or AVX-512 BF16 instructions, else float32. Pure: the
  machine's facts are arguments.
  """
  if mode == "off":
    return FLOAT32
  if mode == "bfloat16":
    return BFLOAT16
  if mode == "float16":
    return FLOAT16
  if gpu_capabilities:
    oldest = min(gpu_capabilities)
    return BFLOAT16 if oldest >= (8, 0) else \
        FLOAT16 if oldest >= (7, 0) and loss_scaling else FLOAT32
  return BFLOAT16 if _BF16_CPU_FLAGS & set(cpu_flags) else FLOAT32


def cpu_flags(cpuinfo: pathlib.Path = pathlib.Path("/proc/cpuinfo")) -> set[str]:
  """This machine's CPU feature flags (empty where /proc/cpuinfo does not exist)."""
  try:
    text = cpuinfo.read_text()
  except OSError:
    return set()
  return {flag for line in text.splitlines() if line.startswith("flags")
          for flag in line.split(":", 1)[1].split()}


def gpu_capabilities() -> list[tuple[int, int]]:
  import tensorflow as tf
  return [tuple(tf.config.experimental.get_device_details(gpu).get("compute_capability", (0, 0)))
          for gpu in tf.config.list_physical_devices("GPU")]


def policy_for(mode: str, loss_scaling: bool = True) -> str:
  """`choose_policy` with this machine's CPU flags and GPUs."""
  if mode != "auto":
    return choose_policy(mode)
  return choose_policy(mode, cpu_flags(), gpu_capabilities(), loss_scaling)


@contextlib.contextmanager
def building_with(policy: str):
  """Layers made inside use `policy`; Keras's global policy is restored after."""
  import keras
  previous = keras.config.dtype_policy()
  keras.config.set_dtype_policy(policy)
  try:
    yield
  finally:
    keras.config.set_dtype_policy(previous)


def keep_outputs_float32(model) -> None:
  """Gives the layers that produce `model`'s outputs the float32 policy, as the Keras mixed
  precision guide asks (a bfloat16/float16 softmax or logits lose precision, and
  MultiWorkerMirrored cannot gather bfloat16 predictions). Models without symbolic outputs
  (subclassed) are left as written: their last layer should say dtype="float32"."""
  try:
    outputs = model.outputs
  except (AttributeError, ValueError):
    return
  for output in outputs or ():
    layer = output._keras_history.operation
    if layer.dtype_policy.compute_dtype != FLOAT32:
      layer.dtype_policy = FLOAT32
