"""Which Keras dtype policy the config's `training.mixed_precision` means on this machine
(applied while the model is built by `tfdist.training.dtype_policy`).

`auto` is decided by measurement (`tfdist.machine.speed`): the half type this device supports
(bfloat16 on GPUs of compute capability >= 8.0 and CPUs with AVX-512 BF16 or AMX, float16 with
loss scaling on 7.x GPUs) when a representative training step runs at least `MIN_SPEEDUP` times
faster in it than in float32 here, else float32.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

from tfdist.machine import facts, speed

_BF16_CPU_FLAGS = {"amx_bf16", "avx512_bf16"}
FLOAT32 = "float32"
BFLOAT16 = "mixed_bfloat16"
FLOAT16 = "mixed_float16"
# Half precision costs exactness (bfloat16 keeps 8 bits of mantissa): take it for a clear gain
# only, not for a measurement's noise.
MIN_SPEEDUP = 1.1


def half_candidate(cpu_flags: Iterable[str] = (), gpu_capabilities: Sequence[tuple[int, int]] = (),
                   loss_scaling: bool = True) -> str | None:
  """The half type worth measuring on this machine, or None. Pure.

  Args:
    cpu_flags: the CPU's feature flags (used when there is no GPU).
    gpu_capabilities: each GPU's compute capability; the oldest decides.
    loss_scaling: whether the strategy allows float16's loss scaling.

  Returns:
    "bfloat16" (GPUs >= 8.0, CPUs with AMX or AVX-512 BF16), "float16" (7.x GPUs where loss
    scaling works), else None.

  >>> half_candidate({"avx512_bf16"})
  'bfloat16'
  """
  if gpu_capabilities:
    oldest = min(gpu_capabilities)
    return "bfloat16" if oldest >= (8, 0) else \
        "float16" if oldest >= (7, 0) and loss_scaling else None
  return "bfloat16" if _BF16_CPU_FLAGS & set(cpu_flags) else None


def choose_policy(mode: str, half: str | None = None, speedup: float | None = None) -> str:
  """The Keras dtype policy for `mode` (off, auto, bfloat16, float16). Pure.

  Args:
    mode: the config's `training.mixed_precision`.
    half: for `auto`, the half type this machine supports (`half_candidate`).
    speedup: for `auto`, float32's step time over `half`'s, measured here.

  Returns:
    "float32", "mixed_bfloat16" or "mixed_float16".

  >>> choose_policy("auto", "bfloat16", speedup=0.6)
  'float32'
  """
  if mode == "off":
    return FLOAT32
  if mode in ("bfloat16", "float16"):
    return f"mixed_{mode}"
  if half is None or speedup is None or speedup < MIN_SPEEDUP:
    return FLOAT32
  return f"mixed_{half}"


@dataclasses.dataclass(frozen=True)
class Precision:
  """What `training.mixed_precision` means here.

  Attributes:
    mode: the config's value.
    policy: the Keras dtype policy.
    measurement: for `auto`, the probe's `speed.Measurement` (None where no half type was a
      candidate, or the mode was not auto).
    fell_back: why `auto`'s half precision was given up for float32 (the model did not build
      in it), or None.
  """
  mode: str
  policy: str
  measurement: speed.Measurement | None = None
  fell_back: str | None = None

  def in_float32(self, why: str) -> "Precision":
    """This choice given up for float32, saying `why`."""
    return dataclasses.replace(self, policy=FLOAT32, fell_back=why)

  def measured(self) -> str | None:
    """What `auto` measured, for the start line: "bfloat16 measured 1.83x float32 on CPU
    ... (cached)"; None when it measured nothing."""
    m = self.measurement
    if m is None:
      return None
    return (f"{m.half} measured {m.speedup:.2f}x float32 on {m.device}"
            f"{' (cached)' if m.cached else ''}")

  def describe(self) -> str:
    """The policy with what `auto` measured: "mixed_bfloat16 (bfloat16 measured 1.83x ...)"."""
    measured = self.measured()
    return self.policy + (f" ({measured})" if measured else "")


def policy_for(mode: str, loss_scaling: bool = True, measure=None) -> Precision:
  """What `mode` means on this machine, measuring (or reading the cached answer) for `auto`.

  Args:
    mode: the config's `training.mixed_precision`.
    loss_scaling: whether the strategy allows float16's loss scaling.
    measure: the probe, `measure(half, device) -> speedup` (tests force its answer).

  Returns:
    A `Precision`.

  ```python
  precision = policy_for("auto")
  print(precision.describe())   # "float32" or "mixed_bfloat16 (bfloat16 measured ...)"
  ```
  """
  if mode != "auto":
    return Precision(mode, choose_policy(mode))
  half = half_candidate(facts.cpu_flags(), facts.gpu_capabilities(), loss_scaling)
  if half is None:
    return Precision(mode, FLOAT32)
  measurement = speed.half_speedup(half, measure=measure)
  return Precision(mode, choose_policy(mode, half, measurement.speedup), measurement)
