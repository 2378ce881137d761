"""What a bug report needs about the machine: versions, the TensorFlow build, devices, CPU
features, what tfdist's `auto` settings pick here, and whether free ports can be had.

```python
print(render(gather()))      # `tfdist env`
```
"""

from __future__ import annotations

import os
import pathlib
import platform
from importlib import metadata
from typing import Mapping

_CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16",
                 "amx_tile", "amx_bf16", "amx_int8")


KERAS_DISTRIBUTION = (
    "does nothing by itself on the TensorFlow backend (Keras places every weight, full size, "
    "on one device); call tfdist.use_keras_distribution() after "
    "keras.distribution.set_distribution(DataParallel(...)): it trains through tf.distribute")
"""What `tfdist env` says of `keras.distribution` (issue 36)."""


def gather(cpuinfo: pathlib.Path = pathlib.Path("/proc/cpuinfo")) -> dict:
  """This machine's facts, as a JSON-ready dict (imports TensorFlow)."""
  import portpicker
  import tensorflow as tf

  from tfdist.machine import facts
  from tfdist.machine.precision import policy_for

  build = tf.sysconfig.get_build_info()
  gpus = [{"name": gpu["name"], "compute_capability": ".".join(map(str, gpu["compute_capability"]))}
          for gpu in facts.gpus()]
  flags = facts.cpu_flags(cpuinfo)
  return {
      "python": platform.python_version(),
      "tensorflow": tf.__version__,
      "tensorflow_build": ("cuda" if build.get("is_cuda_build") else "cpu") +
                          (f", CUDA {build.get('cuda_version')}, cuDNN "
                           f"{build.get('cudnn_version')}" if build.get("is_cuda_build") else ""),
      "keras": _version("keras"),
      "tensorboard": _version("tensorboard"),
      "tfdist": _version("tfdist"),
      "os": f"{platform.system()} {platform.release()}",
      "cpu": f"{facts.cpu_model(cpuinfo)}, {os.cpu_count()} logical cores",
      "cpu_features": " ".join(f for f in _CPU_FEATURES if f in flags) or "none of note",
      "gpus": gpus,
      "auto_precision": policy_for("auto").describe(),
      "keras_distribution": KERAS_DISTRIBUTION,
      "free_ports": [portpicker.pick_unused_port() for _ in range(2)],
      "tf_config": os.environ.get("TF_CONFIG", ""),
  }


def render(facts: Mapping) -> str:
  """The facts as `key: value` lines, to paste into a bug report. Pure."""
  lines = []
  for key, value in facts.items():
    if key == "gpus":
      value = "; ".join(f"{g['name']} (compute capability {g['compute_capability']})"
                        for g in value) or "none"
    elif isinstance(value, list):
      value = ", ".join(map(str, value))
    lines.append(f"{key}: {value if value != '' else '(unset)'}")
  return "\n".join(lines)


def differences(reports: Mapping[str, Mapping]) -> list[str]:
  """Lines naming each fact that differs between tasks (free ports and TF_CONFIG always do,
  and are left out). Pure."""
  lines = []
  keys = sorted({k for r in reports.values() for k in r} - {"free_ports", "tf_config"})
  for key in keys:
    values = {task: r.get(key) for task, r in reports.items()}
    if len({repr(v) for v in values.values()}) > 1:
      lines.append(f"{key} differs: " + "; ".join(f"{t}: {v}" for t, v in values.items()))
  return lines


def _version(package: str) -> str:
  try:
    return metadata.version(package)
  except metadata.PackageNotFoundError:
    return "not installed"
