"""What this machine has: the CPU's feature flags and model, the GPUs TensorFlow sees.

```python
from tfdist.machine import facts
"avx512_bf16" in facts.cpu_flags()
```
"""

from __future__ import annotations

import os
import pathlib
import platform
import subprocess

CPUINFO = pathlib.Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: pathlib.Path = CPUINFO) -> set[str]:
  """This machine's CPU feature flags (empty where /proc/cpuinfo does not exist).

  Args:
    cpuinfo: the file to read; `/proc/cpuinfo` by default.

  Returns:
    The set of flags, e.g. `{"avx512f", "avx512_bf16", ...}`.
  """
  try:
    text = cpuinfo.read_text()
  except OSError:
    return set()
  return {flag for line in text.splitlines() if line.startswith("flags")
          for flag in line.split(":", 1)[1].split()}


def cpu_model(cpuinfo: pathlib.Path = CPUINFO) -> str:
  """The CPU's model name, e.g. "Intel(R) Xeon(R) Platinum 8488C"."""
  try:
    for line in cpuinfo.read_text().splitlines():
      if line.startswith("model name"):
        return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "unknown"


def gpus() -> list[dict]:
  """The GPUs TensorFlow sees: `[{"name": ..., "compute_capability": (9, 0)}]`. TensorFlow is
  imported only where a GPU is visible (`visible_gpus`): a CPU machine answers at once."""
  if not visible_gpus():
    return []
  import tensorflow as tf
  found = []
  for gpu in tf.config.list_physical_devices("GPU"):
    details = tf.config.experimental.get_device_details(gpu)
    found.append({"name": details.get("device_name", gpu.name),
                  "compute_capability": tuple(details.get("compute_capability", (0, 0)))})
  return found


def gpu_capabilities() -> list[tuple[int, int]]:
  """The compute capability of each GPU TensorFlow sees (`gpus`)."""
  return [gpu["compute_capability"] for gpu in gpus()]


def visible_gpus(environ=None, proc: pathlib.Path = pathlib.Path("/proc/driver/nvidia/gpus")
                 ) -> list[str]:
  """The GPUs processes started here may use, as `CUDA_VISIBLE_DEVICES` names them, without
  importing TensorFlow: that variable's list when it is set (Slurm, a pod's runtime, the user),
  else one index per GPU the NVIDIA driver lists.

  Args:
    environ: the environment to read; `os.environ` by default.
    proc: the driver's directory of GPUs (one entry each).

  Returns:
    E.g. `["0", "1"]`; empty on a machine without NVIDIA GPUs.

  >>> visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"})
  ['2', '3']
  """
  environ = os.environ if environ is None else environ
  listed = environ.get("CUDA_VISIBLE_DEVICES")
  if listed is not None:
    names = [name.strip() for name in listed.split(",") if name.strip()]
    return [] if names[:1] == ["-1"] else names
  try:
    return [str(i) for i in range(len(list(proc.iterdir())))]
  except OSError:
    return []


def gpu_memory_mib(index: str = "0") -> int | None:
  """GPU `index`'s memory in MiB (from nvidia-smi: TensorFlow reports use, not size), or None
  where nvidia-smi is missing or does not answer."""
  try:
    done = subprocess.run(["nvidia-smi", "--query-gpu=memory.total",
                           "--format=csv,noheader,nounits", "-i", index],
                          capture_output=True, text=True, timeout=20, check=True)
    return int(done.stdout.split()[0])
  except (OSError, subprocess.SubprocessError, ValueError, IndexError):
    return None
