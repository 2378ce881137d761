"""Keras's own distribution API (`keras.distribution`) on TensorFlow, through tfdist.

On the TensorFlow backend `keras.distribution.set_distribution(DataParallel())` does nothing:
Keras places every weight, full size, on one device and `model.fit` trains there, silently
(measured with Keras 3.15, TensorFlow 2.21; keras-team/keras#18473). `use_keras_distribution()`
is the switch: it turns the distribution set into the strategy that does it, and sets that
strategy for the whole process (`tf.distribute.experimental_set_strategy`), so the models the
script builds afterwards, and Keras's own `fit`, `evaluate` and `predict` on them, run
data-parallel:

- one process: `MirroredStrategy` over the mesh's devices;
- a task of a multi-worker cluster (`tfdist launch`, TF_CONFIG): the task's
  `MultiWorkerMirroredStrategy`, each process's mesh being its own devices (Keras's
  `initialize()` variables, where set, must agree with TF_CONFIG).

Keras's `fit`, `evaluate` and `predict` of such a model run inside tfdist's Keras 3 fixes
(`keras_fixes.install`), as `tfdist.fit`'s do. `ModelParallel` in one process splits the
Dense kernels its layout map lays out over the "model" axis (`tfdist.parallel.layouts`:
column- and row-parallel, each slice computed on its device); a layout tfdist cannot honour is
refused in one line naming the key pattern and the layout. The switch also gives Keras's
`keras.distribution.distribute_tensor`, which its TensorFlow backend lacks, tfdist's answer.

```python
import keras, tfdist
keras.distribution.set_distribution(keras.distribution.DataParallel())
strategy = tfdist.use_keras_distribution()    # the switch
model = make_model()                           # built under the strategy
model.compile(...); model.fit(x, y)            # data parallel, one device's results
```
"""

from __future__ import annotations

import functools
import os

from tfdist.config.loader import ConfigLike, as_config
from tfdist.errors import ConfigError, UnsupportedError

_KERAS_ENV = ("KERAS_DISTRIBUTION_NUM_PROCESSES", "KERAS_DISTRIBUTION_PROCESS_ID")
_installed = []  # (distribution, strategy) switched: their models' Keras calls get the fixes.


def _upstream_distribute_tensor():
  """Keras's TensorFlow backend has no `distribute_tensor` (Keras 3.15: its distribution_lib is
  a DTensor prototype, keras-team/keras#18473), so `keras.distribution.distribute_tensor` fails
  with AttributeError there; the switch gives it tfdist's. None while that is so (a test says
  when it no longer is)."""
  from keras.src.backend.tensorflow import distribution_lib
  found = getattr(distribution_lib, "distribute_tensor", None)
  return None if found is distribute_tensor else found


def use_keras_distribution(config: ConfigLike = None):
  """Runs the `keras.distribution` set in this process through a tf.distribute strategy.

  Call it after `keras.distribution.set_distribution(...)` and before building the model.

  Args:
    config: the config (None: the launched task's, from the environment); its cluster decides
      between one process (MirroredStrategy over the mesh's devices) and a task of several
      (its MultiWorkerMirroredStrategy).

  Returns:
    The strategy, now the process's default (`tf.distribute.get_strategy()`).

  Raises:
    ConfigError: no distribution is set, a mesh device this process does not have, a
      multi-worker config whose strategy is not multi_worker_mirrored, Keras's
      `initialize()` variables disagreeing with TF_CONFIG, or a ModelParallel mesh or layout
      tfdist cannot honour.
    UnsupportedError: a `ModelParallel` distribution in a task of several workers.

  Example:

  ```python
  import keras
  import tensorflow as tf
  import tfdist
  keras.distribution.set_distribution(keras.distribution.DataParallel())
  strategy = tfdist.use_keras_distribution()
  model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
  model.layers[0].kernel.value.values      # one copy per device
  keras.distribution.set_distribution(None)  # Ended: no distribution, no strategy.
  tf.distribute.experimental_set_strategy(None)
  ```
  """
  import keras
  import tensorflow as tf
  from tfdist.strategy.factory import make_strategy, mirrored

  distribution = keras.distribution.distribution()
  if distribution is None:
    raise ConfigError("no distribution is set: call keras.distribution.set_distribution("
                      "keras.distribution.DataParallel()) before tfdist.use_keras_distribution()",
                      key="keras.distribution", received=None)
  _refuse_unapplied(as_config(config))
  from tfdist.strategy.devices import configure_devices
  configure_devices(as_config(config).devices)  # Done already in a launched task.
  if isinstance(distribution, keras.distribution.ModelParallel):
    from tfdist.parallel import layouts
    if as_config(config).cluster.is_multi_worker:
      raise UnsupportedError("keras.distribution.ModelParallel: runs in one process here; "
                             "for data parallel over split models across workers use the "
                             "config's parallel: section")
    _require_local([str(d) for d in distribution.device_mesh.devices.flatten()])
    layouts.activate(distribution)
    _install(distribution, tf.distribute.get_strategy())
    return tf.distribute.get_strategy()
  if not isinstance(distribution, keras.distribution.DataParallel):
    raise UnsupportedError(f"keras.distribution: {type(distribution).__name__} is not run on "
                           "TensorFlow by tfdist; use DataParallel")
  config = as_config(config)
  devices = [str(d) for d in distribution.device_mesh.devices.flatten()]
  _require_local(devices)
  if config.cluster.is_multi_worker:
    _require_agreement(config)
    strategy = make_strategy(config)
  else:
    strategy = mirrored(["/" + d for d in devices])  # tfdist.fit's own over the same devices.
  tf.distribute.experimental_set_strategy(strategy)
  _install(distribution, strategy)
  return strategy


def distribute_tensor(tensor, layout):
  """`keras.distribution.distribute_tensor` on TensorFlow, once tfdist is switched on.

  As on JAX: inside a step (a replica's context, or a traced function) the layout is a hint and
  the tensor comes back as it is; eagerly, a layout that shards the batch axis (the first) gives
  each replica its slice on its device, and one that shards nothing gives each a copy (a
  `PerReplica` value of the switched strategy). A layout over any other axis is refused in one
  line: tfdist lays out only Dense kernels, through the LayoutMap.

  Args:
    tensor: the tensor (a KerasTensor comes back as it is).
    layout: a `keras.distribution.TensorLayout` of the current distribution's mesh.

  Returns:
    The tensor, or a `PerReplica` value of the process's strategy.

  Raises:
    UnsupportedError: a layout over another axis than the batch's.
    ConfigError: a batch that the replicas do not divide.
  """
  import tensorflow as tf
  axes = tuple(layout.axes)
  if tf.inside_function() or not tf.distribute.in_cross_replica_context():
    return tensor
  import keras
  batch = getattr(keras.distribution.distribution(), "batch_dim_name", None)
  if any(axes[1:]) or (axes and axes[0] not in (None, batch)):
    raise UnsupportedError(f"keras.distribution.distribute_tensor: lays out axes {axes}: tfdist "
                           f"runs the batch axis ({batch!r}, first) on TensorFlow, and Dense "
                           "kernels through the LayoutMap")
  strategy = tf.distribute.get_strategy()
  replicas = strategy.num_replicas_in_sync
  sharded = bool(axes) and axes[0] is not None
  if sharded and tensor.shape[0] % replicas:
    raise ConfigError(f"must divide among the {replicas} replicas of the batch axis {batch!r}",
                      key="keras.distribution.distribute_tensor", received=tensor.shape[0])
  pieces = tf.split(tensor, replicas) if sharded else [tensor] * replicas
  devices = strategy.extended.worker_devices  # This process's, in replica order.

  def placed(context):
    replica = context.replica_id_in_sync_group
    with tf.device(devices[replica % len(devices)]):
      return tf.identity(pieces[replica])
  return strategy.experimental_distribute_values_from_function(placed)


def _require_local(devices) -> None:
  """Each process's mesh is its own devices: TensorFlow's multi-worker strategy joins them."""
  from keras.src.backend.tensorflow.distribution_lib import list_devices
  here = set(list_devices("cpu")) | set(list_devices("gpu"))
  missing = [d for d in devices if d not in here]
  if missing:
    raise ConfigError(f"must name this process's devices ({', '.join(sorted(here))}): each "
                      "process of a cluster runs its own devices, and tfdist joins them",
                      key="keras.distribution.DataParallel.device_mesh", received=missing)


def _require_agreement(config) -> None:
  """Keras's `initialize()` variables, where set, name the cluster TF_CONFIG names."""
  from tfdist.config import strategies
  if not strategies.kind(config.strategy.name).all_reduces_across_workers:
    raise ConfigError(f"must be {strategies.across_workers(False)} for "
                      "keras.distribution.DataParallel on a cluster of several workers",
                      key="strategy.name",
                      received=config.strategy.name, source=config.source)
  expected = {_KERAS_ENV[0]: str(config.cluster.training_tasks),
              _KERAS_ENV[1]: str(config.task.index) if config.task else None}
  for name, value in expected.items():
    if os.environ.get(name) not in (None, value):
      raise ConfigError(f"must agree with TF_CONFIG's cluster ({value})", key=name,
                        received=os.environ[name])


def _refuse_unapplied(config) -> None:
  """Refuses the config's keys Keras's own fit does not apply (`tfdist.config.honoured`): its
  training, checkpoint, TensorBoard and split settings, and, in one process (where the mesh
  makes the strategy), its strategy's too. Its devices are applied (`configure_devices`)."""
  from tfdist.config import honoured
  from tfdist.training import settings
  keys = tuple(k for k in honoured.DECISIONS if not (
      config.cluster.is_multi_worker and k.startswith("strategy.")))
  settings.refuse_unhonoured(config, (honoured.KERAS,), keys)


def _install(distribution, strategy) -> None:
  """While `distribution` is Keras's current one, Keras's fit, evaluate and predict of the
  models built under `strategy` check the layout map and lay out split models; tfdist's Keras 3
  fixes wrap them for every replicated strategy (`keras_fixes.install`)."""
  _installed.append((distribution, strategy))
  if len(_installed) > 1:
    return
  import keras
  from keras.src.backend.tensorflow import distribution_lib
  from tfdist.parallel import layouts
  from tfdist.training import keras_fixes
  keras_fixes.install()
  if _upstream_distribute_tensor() is None:
    distribution_lib.distribute_tensor = distribute_tensor

  def checked(method):
    @functools.wraps(method)
    def call(model, *args, **kwargs):
      current = keras.distribution.distribution()
      if current is not None and layouts.is_active(current):
        layouts.require_every_key_matched(current, model)
      if any(d is current for d, _ in _installed):
        _split(model)
      return method(model, *args, **kwargs)
    return call

  for name in ("fit", "evaluate", "predict"):
    setattr(keras.Model, name, checked(getattr(keras.Model, name)))


def _split(model) -> bool:
  """Whether `model` has Dense layers a ModelParallel layout split (then its optimizer's slots
  go on their variables' devices, and XLA, which compiles for one device, is off)."""
  from tfdist.parallel import layouts, placement
  if not layouts.split_layers(model):
    return False
  model.jit_compile = False
  optimizer = getattr(model, "optimizer", None)
  optimizer = getattr(optimizer, "inner_optimizer", optimizer)
  if optimizer is not None and not optimizer.built and \
      not getattr(optimizer, "tfdist_colocated", False):
    placement.colocate_optimizer_state(optimizer)
    optimizer.tfdist_colocated = True
  return True
