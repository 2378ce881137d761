"""Strategy factories: a config (or a name and options) in, a `tf.distribute.Strategy` out.

One builder per strategy name, registered in `BUILDERS`; `make_strategy` picks by
`config.strategy.name`, and each public function (`mirrored`, `multi_worker_mirrored`, ...) takes
the same options as the YAML and validates them by the same rules.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import threading
import time
from typing import Any, Callable, Mapping

import tfdist.progress as progress
from tfdist.config import loader, rules, strategies
from tfdist.config.loader import ConfigLike, as_config
from tfdist.config.schema import Config, StrategyConfig
from tfdist.errors import ConfigError, DeviceSetupError
from tfdist.strategy.devices import (RUN_TENSORFLOW_LATER, configure_devices, replica_devices,
                                     local_gpu_count)
from tfdist.strategy.resolver import cluster_resolver

# One strategy per process for each distinct setting: two strategies over the same devices start
# their collective keys at the same values, and the second one's all-reduce then collides with
# the first's ("Shape mismatch in the collective instance 100", measured with TF 2.21).
_STRATEGIES: dict[str, Any] = {}
_MIRRORED: dict[tuple, Any] = {}  # One MirroredStrategy per set of devices (_build_mirrored).
_MAKING = threading.local()  # Set while tfdist itself makes a strategy (`making`).


def make_strategy(config: ConfigLike = None):
  """Makes the strategy a config names, for the task this process runs.

  The same strategy, cluster, devices and task give the same strategy object within a process
  (the training settings, which `training.settings` applies to every path, do not make
  another).
  Applies `devices` first (before TensorFlow initialises its devices). An evaluator task gets
  the default strategy: it evaluates on its own machine.

  Args:
    config: a `Config`, or anything `tfdist.load_config` takes (None reads the environment).

  Returns:
    The `tf.distribute.Strategy`.

  Raises:
    ConfigError: the task runs a server rather than a strategy, or the cluster is incomplete.
    DeviceSetupError: devices were configured too late.

  Example:

  ```python
  import keras
  import tfdist
  strategy = tfdist.make_strategy("configs/mirrored.yaml")
  with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
  ```
  """
  config = as_config(config)
  key = repr((config.strategy.name, config.strategy.options, config.devices, config.cluster,
              config.task))
  if key not in _STRATEGIES:
    _MAKING.depth = getattr(_MAKING, "depth", 0) + 1
    try:
      _STRATEGIES[key] = _make(config)
    finally:
      _MAKING.depth -= 1
  return _STRATEGIES[key]


def making() -> bool:
  """Whether tfdist is making a strategy in this thread now (a strategy's constructor called
  then is tfdist's, not a script's own)."""
  return getattr(_MAKING, "depth", 0) > 0


def _make(config: Config):
  configure_devices(config.devices)
  name, task = config.strategy.name, config.task
  if task is not None and task.type == "evaluator":
    import tensorflow as tf
    return tf.distribute.get_strategy()
  if strategies.kind(name).asynchronous and task is not None and task.type != "chief":
    raise ConfigError(f"{task} of a {name} cluster runs a server, not a strategy: "
                      "call tfdist.run_cluster_server(config) there (tfdist launch does)", key="task",
                      received=str(task), source=config.source)
  return BUILDERS[name](config.strategy.options, config)


def _with_strategy(name: str, options: Mapping[str, Any], config: ConfigLike) -> Config:
  """`config` with its strategy replaced, checked again by the same rules."""
  config = dataclasses.replace(
      as_config(config), strategy=StrategyConfig(name, loader.make_options(name, options)))
  rules.check(config)
  return config


def default():
  """TensorFlow's default strategy: one device, no distribution.

  Returns:
    `tf.distribute.get_strategy()` outside any scope.

  Example:

  ```python
  import tfdist
  tfdist.default().num_replicas_in_sync   # 1
  ```
  """
  return make_strategy(_with_strategy("default", {}, {}))


def one_device(device: str | None = None):
  """`tf.distribute.OneDeviceStrategy`: every variable and step on one device.

  Args:
    device: a device name; None means the first GPU, else the CPU.

  Returns:
    The strategy.

  Raises:
    ConfigError: `device` is not a device name.

  Example:

  ```python
  import tfdist
  strategy = tfdist.one_device("/cpu:0")
  ```
  """
  return make_strategy(_with_strategy("one_device", {"device": device}, {}))


def mirrored(devices=(), cross_device_ops: str = "auto", *, logical_cpus: int = 0,
             gradient_compression: str = "none"):  # The last: refused unless "none", for 0.1.
  """`tf.distribute.MirroredStrategy` over this machine's devices.

  Args:
    devices: device names; empty means every GPU, else every logical CPU.
    cross_device_ops: auto, nccl, hierarchical_copy or reduction_to_one.
    logical_cpus: split the CPU into this many devices first (as `devices.logical_cpus`).
    gradient_compression: a training setting, which a strategy never applied: refused unless
      "none" (set `training.gradient_compression` in the config `tfdist.fit` trains with);
      gone in 0.2.

  Returns:
    The strategy.

  Raises:
    ConfigError: an option breaks its rule (the same rules as the YAML's).
    DeviceSetupError: `logical_cpus` asked for after TensorFlow initialised its devices.

  Example:

  ```python
  import tfdist
  strategy = tfdist.mirrored(logical_cpus=2)   # 2 replicas on a machine without GPUs
  strategy.num_replicas_in_sync                # 2
  ```
  """
  _refuse_training_setting(gradient_compression)
  options = {"devices": list(devices), "cross_device_ops": cross_device_ops}
  return make_strategy(_with_strategy(
      "mirrored", options, {"devices": {"logical_cpus": logical_cpus}}))


def central_storage(compute_devices=(), parameter_device: str | None = None, *,
                    logical_cpus: int = 0):
  """`tf.distribute.experimental.CentralStorageStrategy`: variables on one device.

  Args:
    compute_devices: device names; empty means every GPU, else every logical CPU.
    parameter_device: where variables live; None lets TensorFlow choose.
    logical_cpus: split the CPU into this many devices first.

  Returns:
    The strategy: each step on every compute device, the variables on the parameter device.

  Raises:
    ConfigError: a device name or count that breaks the YAML's rules.
    DeviceSetupError: the CPU split asked for once TensorFlow runs.

  Example:

  ```python
  import tfdist
  strategy = tfdist.central_storage(logical_cpus=2, parameter_device="/cpu:0")
  ```
  """
  options = {"compute_devices": list(compute_devices), "parameter_device": parameter_device}
  return make_strategy(_with_strategy(
      "central_storage", options, {"devices": {"logical_cpus": logical_cpus}}))


def multi_worker_mirrored(communication: str = "auto", timeout_seconds: float | None = None,
                          bytes_per_pack: int = 0, *, config: ConfigLike = None,
                          gradient_compression: str = "none"):
  """`tf.distribute.MultiWorkerMirroredStrategy` over the chief and workers of a cluster.

  Args:
    communication: auto, ring or nccl.
    timeout_seconds: deadline of every collective; None for none.
    bytes_per_pack: gradient pack size in bytes; 0 lets TensorFlow decide.
    config: where the cluster and task come from; None reads TF_CONFIG (checked first).
    gradient_compression: a training setting, which a strategy never applied: refused unless
      "none" (set `training.gradient_compression` in the config `tfdist.fit` trains with);
      gone in 0.2.

  Returns:
    The strategy; without a cluster (no TF_CONFIG, no `cluster` section), one worker.

  Raises:
    ConfigError: an option breaks its rule, or the cluster has no addresses or no task.
    DeviceSetupError: made after TensorFlow ran something (its collectives must be set up
      first).

  Example:

  ```python
  import tfdist
  # Under `tfdist launch`, the launched task's cluster; here, one worker.
  strategy = tfdist.multi_worker_mirrored(communication="ring")
  ```
  """
  _refuse_training_setting(gradient_compression)
  options = {"communication": communication, "timeout_seconds": timeout_seconds,
             "bytes_per_pack": bytes_per_pack}
  return make_strategy(_with_strategy("multi_worker_mirrored", options, config))


def _refuse_training_setting(gradient_compression: str) -> None:
  """The strategy functions' `gradient_compression`, which no strategy applies (0.1 accepted it
  and ignored it): refused in one line, naming where it goes."""
  if gradient_compression != "none":
    raise ConfigError("is a training setting, not a strategy's: set "
                      "training.gradient_compression in the config tfdist.fit or "
                      "tfdist.TrainingLoop trains with", key="gradient_compression",
                      received=gradient_compression)


def parameter_server(max_shards: int = 1, min_shard_bytes: int = 256 << 10, *,
                     config: ConfigLike = None):
  """`tf.distribute.ParameterServerStrategy`, made on the chief (the coordinator).

  Args:
    max_shards: split large variables over at most this many ps tasks (1: no sharding).
    min_shard_bytes: the smallest shard worth making.
    config: where the cluster and task come from; None reads TF_CONFIG (checked first).

  Returns:
    The strategy, connected to the cluster's workers and ps tasks.

  Raises:
    ConfigError: an option breaks its rule; no cluster; or this task is a worker or ps (those
      run `tfdist.run_cluster_server`).

  Example:

  ```python
  import portpicker
  import tfdist
  cluster = {role: [f"127.0.0.1:{portpicker.pick_unused_port()}"]
             for role in ("chief", "worker", "ps")}
  config = {"strategy": "parameter_server", "cluster": cluster}
  servers = [tfdist.start_cluster_server({**config, "task": {"type": role, "index": 0}})
             for role in ("worker", "ps")]   # Other hosts, in a real cluster.
  strategy = tfdist.parameter_server(config={**config, "task": {"type": "chief", "index": 0}})
  ```
  """
  options = {"max_shards": max_shards, "min_shard_bytes": min_shard_bytes}
  return make_strategy(_with_strategy("parameter_server", options, config))


def _build_default(options, config: Config):
  import tensorflow as tf
  return tf.distribute.get_strategy()


def _build_one_device(options, config: Config):
  import tensorflow as tf
  return tf.distribute.OneDeviceStrategy(
      options.device or ("/gpu:0" if local_gpu_count() else "/cpu:0"))


def _build_mirrored(options, config: Config):
  import tensorflow as tf
  cross_device_ops = {
      # Logical GPUs of one GPU: NCCL cannot put two ranks on one GPU (TensorFlow's own auto
      # picks it there and fails); hierarchical copy works (measured on an H100).
      "auto": lambda: tf.distribute.HierarchicalCopyAllReduce() if config.devices.logical_gpus > 1
      else None,
      "nccl": tf.distribute.NcclAllReduce,
      "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
      "reduction_to_one": tf.distribute.ReductionToOneDevice,
  }[options.cross_device_ops]()
  devices = list(options.devices) or replica_devices(config.devices)
  local = [tf.DeviceSpec.from_string(d) for d in devices]
  local = [(d.device_type or "CPU").upper() + f":{d.device_index or 0}" for d in local]
  # Two MirroredStrategies over the same devices number their collectives alike and abort each
  # other ("Shape mismatch in the collective instance 100", measured with TensorFlow 2.21):
  # configs that differ elsewhere (logical_cpus given or not) share one.
  key = (tuple(local), options.cross_device_ops, config.devices.logical_gpus)
  if key not in _MIRRORED:
    _MIRRORED[key] = tf.distribute.MirroredStrategy(devices, cross_device_ops=cross_device_ops)
  return _MIRRORED[key]


def _build_central_storage(options, config: Config):
  import tensorflow as tf
  return tf.distribute.experimental.CentralStorageStrategy(
      compute_devices=list(options.compute_devices) or replica_devices(config.devices),
      parameter_device=options.parameter_device)


def _build_multi_worker_mirrored(options, config: Config):
  import tensorflow as tf
  implementation = getattr(tf.distribute.experimental.CommunicationImplementation,
                           options.communication.upper())
  communication = tf.distribute.experimental.CommunicationOptions(
      bytes_per_pack=options.bytes_per_pack, timeout_seconds=options.timeout_seconds,
      implementation=implementation)
  enable_collective_ops_once()
  try:
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        cluster_resolver=cluster_resolver(config), communication_options=communication)
  except RuntimeError as e:
    if "must be configured at program startup" not in str(e):
      raise
    raise DeviceSetupError(
        "multi_worker_mirrored must be made before TensorFlow runs anything (a dataset, an op, "
        f"a Keras optimizer): {RUN_TENSORFLOW_LATER}. Received: {e}") from None
  if config.cluster.training_tasks > 1:
    _leave_together_at_exit()
  return strategy


def enable_collective_ops_once() -> None:
  """Makes a second MultiWorkerMirroredStrategy in a process (a launched script's own, after the
  one tfdist made at import) keep the collective runtime the first enabled, when its server is
  the same. TensorFlow enables it again on a running context (`Context.enable_collective_ops`,
  its TODO b/129298253; no GitHub issue found): a worker doing so while its peer already
  broadcast the first variable's initial value left both waiting for ever (1 launch of
  TensorFlow's tutorial script in 8 on 2 vCPUs). tests/test_keras_contract.py counts
  TensorFlow's own calls: delete this once it enables them once."""
  from tensorflow.python.eager import context
  own = context.Context.enable_collective_ops
  if getattr(own, "tfdist_once", False):
    return

  def once(self, server_def):
    if self._context_handle is not None and \
        server_def == getattr(self, "_collective_ops_server_def", None):
      return
    own(self, server_def)
  once.tfdist_once = True
  context.Context.enable_collective_ops = once


_EXIT_BARRIER_MS = 10 * 60 * 1000  # A peer's own end of script: evaluation, saving.
_SAID_AFTER_S = 10.0  # A longer wait there is said in the task's output.
_LEAVING_TOGETHER: list = []


def _leave_together_at_exit() -> None:
  """At a clean end, every worker's process leaves when all of them do: one that left while
  its peers still ran made TensorFlow's coordination service report it after its heartbeat
  timeout ("The tasks have crashed" on a clean run, seen with a chief saving for 15 s after
  training). A process ending on an uncaught exception, `sys.exit` with a failure status or a
  preemption leaves at once (a peer that crashed fails the barrier at once too): one that
  waited there after `sys.exit(1)` at start-up hung its peers until the heartbeat timeout."""
  import sys
  if _LEAVING_TOGETHER:
    return
  _LEAVING_TOGETHER.append(True)  # Once a process: one barrier, one excepthook.
  python_hook = sys.excepthook

  def failed(kind, value, traceback):
    progress.end_unclean(kind.__name__)
    python_hook(kind, value, traceback)
  sys.excepthook = failed
  python_exit = sys.exit

  def exit_with(status=None):  # `sys.exit(1)`, "message": not a clean end; leave at once.
    if status not in (None, 0):
      progress.end_unclean(f"sys.exit({status!r})")
    python_exit(status)
  sys.exit = exit_with

  def leave_together():
    if not progress.ends_clean():
      return
    from tensorflow.python.eager import context
    began = time.monotonic()
    with contextlib.suppress(Exception), \
        progress.collective(progress.Collective.EXIT_BARRIER):
      context.context().wait_at_barrier("tfdist_exit", _EXIT_BARRIER_MS)
    waited = time.monotonic() - began
    if waited >= _SAID_AFTER_S:  # A peer's own end (saving, evaluating) kept this one.
      print(f"tfdist: this worker waited {waited:.0f} s at its end for the other workers to "
            "end theirs (tfdist's exit barrier)", file=sys.stderr, flush=True)
  atexit.register(leave_together)


def _build_parameter_server(options, config: Config):
  import tensorflow as tf
  if config.cluster.is_empty:
    raise ConfigError("parameter_server needs a cluster with a chief, workers and ps tasks",
                      key="cluster", received={}, source=config.source)
  partitioner = None
  if options.max_shards > 1:
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=options.min_shard_bytes, max_shards=options.max_shards)
  return tf.distribute.experimental.ParameterServerStrategy(
      cluster_resolver(config), variable_partitioner=partitioner)


BUILDERS: dict[str, Callable[[Any, Config], Any]] = {
    "default": _build_default,
    "one_device": _build_one_device,
    "mirrored": _build_mirrored,
    "central_storage": _build_central_storage,
    "multi_worker_mirrored": _build_multi_worker_mirrored,
    "parameter_server": _build_parameter_server,
}
"""Each declared strategy's builder (`tfdist.config.strategies.KINDS`): its options and the
config in, the `tf.distribute` strategy out. A new strategy is its declaration and this."""
