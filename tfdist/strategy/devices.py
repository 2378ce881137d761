"""Local device set-up that must happen before TensorFlow initialises its devices."""

from __future__ import annotations

from tfdist.config.schema import DevicesConfig
from tfdist.errors import DeviceSetupError

RUN_TENSORFLOW_LATER = (
    "run the script under `tfdist launch` and import tfdist before any TensorFlow code (it makes "
    "the strategy then), or call tfdist.make_strategy(config) first, or pass tfdist.fit a "
    "dataset function and a compile function instead of objects built earlier")


def configure_devices(devices: DevicesConfig) -> None:
  """Splits the CPU into `devices.logical_cpus` logical devices.

  Idempotent: asking again for the split already in force does nothing.

  Raises:
    DeviceSetupError: TensorFlow initialised its devices before this call, with another split.

  ```python
  configure_devices(DevicesConfig(logical_cpus=2))   # first thing, before any op
  tf.config.list_logical_devices("CPU")              # CPU:0 and CPU:1
  ```
  """
  wanted = devices.logical_cpus
  if wanted <= 1:
    return
  import tensorflow as tf

  cpu = tf.config.list_physical_devices("CPU")[0]
  current = tf.config.get_logical_device_configuration(cpu)
  if current is not None and len(current) == wanted:
    return
  try:
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(wanted)])
  except RuntimeError:
    have = len(tf.config.list_logical_devices("CPU"))
    if have != wanted:
      raise DeviceSetupError(
          "devices.logical_cpus: must be applied before TensorFlow initialises its devices: "
          f"{RUN_TENSORFLOW_LATER}. Received: logical_cpus={wanted} with {have} CPU device(s) "
          "already initialised") from None


def local_gpu_count() -> int:
  import tensorflow as tf
  return len(tf.config.list_physical_devices("GPU"))


def local_devices(devices: DevicesConfig) -> list[str]:
  """The devices a single-machine strategy mirrors over by default: every GPU, else every
  logical CPU."""
  import tensorflow as tf

  configure_devices(devices)
  gpus = tf.config.list_logical_devices("GPU")
  return [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
