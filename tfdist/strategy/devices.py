"""Local device set-up that must happen before TensorFlow initialises its devices."""

from __future__ import annotations

from tfdist.config.schema import DevicesConfig
from tfdist.errors import DeviceSetupError
from tfdist.machine import facts

RUN_TENSORFLOW_LATER = (
    "run the script under `tfdist launch` and import tfdist before any TensorFlow code (it makes "
    "the strategy then), or call tfdist.make_strategy(config) first, or pass tfdist.fit a "
    "dataset function and a compile function instead of objects built earlier")


def configure_devices(devices: DevicesConfig) -> None:
  """Sets up this process's devices as the config's `devices` section says, before TensorFlow
  initialises them: `logical_cpus` CPU devices (the GPUs then hidden from this process: it
  runs on the CPU devices it asked for), `logical_gpus` virtual devices on the first GPU, and
  each GPU's `gpu_memory` ("growth", or MiB).

  Idempotent: asking again for the set-up already in force does nothing.

  Args:
    devices: the config's `devices` section (`config.devices`).

  Raises:
    DeviceSetupError: TensorFlow initialised its devices before this call, otherwise; or
      `logical_gpus` without a memory size nvidia-smi or the config gives.

  Example:

  ```python
  import tensorflow as tf
  import tfdist
  tfdist.configure_devices(tfdist.load_config({"devices": {"logical_cpus": 2}}).devices)
  tf.config.list_logical_devices("CPU")   # CPU:0 and CPU:1
  ```
  """
  import tensorflow as tf

  gpus = tf.config.list_physical_devices("GPU")
  wanted = devices.logical_cpus
  if wanted > 1:
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if current is None or len(current) != wanted:
      def have():  # Only once TensorFlow refused: listing devices initialises them.
        return len(tf.config.list_logical_devices("CPU"))
      _before_start(lambda: tf.config.set_logical_device_configuration(
          cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(wanted)]),
                    f"logical_cpus={wanted}", lambda: have() == wanted,
                    initialised=lambda: f"{have()} CPU device(s)")
    if gpus and tf.config.get_visible_devices("GPU"):
      _before_start(lambda: tf.config.set_visible_devices([], "GPU"),
                    f"logical_cpus={wanted} (GPUs hidden)",
                    lambda: not tf.config.list_logical_devices("GPU"))
    return
  if not gpus:
    return
  memory = devices.gpu_memory
  if devices.logical_gpus > 1:
    total = facts.gpu_memory_mib() or 0
    each = memory if isinstance(memory, int) else int(total * 0.9 / devices.logical_gpus)
    if each <= 0:
      raise DeviceSetupError("devices.logical_gpus: needs each device's memory: set "
                             "devices.gpu_memory (MiB); nvidia-smi did not give the GPU's. "
                             f"Received: logical_gpus={devices.logical_gpus}")
    _before_start(lambda: tf.config.set_logical_device_configuration(
        gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=each)
                  for _ in range(devices.logical_gpus)]), f"logical_gpus={devices.logical_gpus}",
                  lambda: len(tf.config.list_logical_devices("GPU")) >= devices.logical_gpus)
  elif isinstance(memory, int):
    for gpu in gpus:
      _before_start(lambda gpu=gpu: tf.config.set_logical_device_configuration(
          gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=memory)]),
                    f"gpu_memory={memory}", lambda: True)
  elif memory == "growth":
    for gpu in gpus:
      _before_start(lambda gpu=gpu: tf.config.experimental.set_memory_growth(gpu, True),
                    "gpu_memory=growth", lambda gpu=gpu: tf.config.experimental.get_memory_growth(gpu))


def _before_start(change, what: str, in_force, initialised=lambda: "the devices") -> None:
  """Runs `change`; when TensorFlow refuses it (its devices are initialised) and `in_force()`
  says the set-up is not there already, a DeviceSetupError naming `what` and what is
  `initialised`."""
  try:
    change()
  except RuntimeError:
    if not in_force():
      raise DeviceSetupError(
          f"devices.{what.split('=')[0]}: must be applied before TensorFlow initialises its "
          f"devices: {RUN_TENSORFLOW_LATER}. Received: {what} with {initialised()} already "
          "initialised") from None


def local_gpu_count() -> int:
  """The GPUs this process may use (those `logical_cpus` hid are not counted)."""
  import tensorflow as tf
  return len(tf.config.get_visible_devices("GPU"))


def replica_devices(devices: DevicesConfig) -> list[str]:
  """The devices a single-machine strategy mirrors over by default: every GPU, else every
  logical CPU."""
  import tensorflow as tf

  configure_devices(devices)
  gpus = tf.config.list_logical_devices("GPU")
  return [d.name for d in (gpus or tf.config.list_logical_devices("CPU"))]
