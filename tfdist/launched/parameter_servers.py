"""Keras's own `model.fit`, `evaluate` and `predict` of a model built under a parameter-server
strategy, as TensorFlow's "Parameter server training" tutorial calls them: run by tfdist's
coordinator loop (`training.parameter_server`), which `tfdist.fit` runs there too.

Keras 3 has no parameter-server training (keras-team/keras#18624): it hands its dataset to the
strategy as is, and TensorFlow refuses it ("To use this dataset, you need to pass this dataset
to ClusterCoordinator.create_per_worker_dataset"), in plain TensorFlow too. The arguments that
loop does not honour are refused in one line (`keras_arguments`, the parameter-server path).
"""

from __future__ import annotations

import functools
import inspect

_METHODS = ("fit", "evaluate", "predict")


def install() -> None:
  """Routes Keras's own fit, evaluate and predict of parameter-server models (others are
  untouched). Idempotent.

  Example:

  ```python
  parameter_servers.install()
  with strategy.scope():          # the script's own ParameterServerStrategy
    model = make_model()
  model.fit(dataset, epochs=5, steps_per_epoch=20)   # tfdist's coordinator loop
  ```
  """
  import keras
  for name in _METHODS:
    method = getattr(keras.Model, name)
    if not getattr(method, "tfdist_parameter_servers", False):
      setattr(keras.Model, name, _routed(method))
  _adding_on_the_ps()


def _adding_on_the_ps() -> None:
  """keras-team/keras#21054: Keras's `assign_add` is `assign(self + delta)`, a read then a
  write; two workers adding to a variable on a ps at once lose one's increment (the tutorial's
  own loop, 2 workers: its accuracy counted 96 of 160 labels in an epoch; `optimizer.iterations`
  undercounts alike). A Keras variable living on a ps adds with TensorFlow's own `assign_add`,
  one atomic op there, as `keras_fixes.count_every_update` does for `tfdist.fit`'s model."""
  import tensorflow as tf
  from keras.src.backend.tensorflow import core
  keras_add = core.Variable.assign_add
  if getattr(keras_add, "tfdist_atomic_on_ps", False):
    return

  @functools.wraps(keras_add)
  def assign_add(variable, value):
    tensor = variable.value
    if "/job:ps/" in (getattr(tensor, "device", "") or ""):
      return tensor.assign_add(tf.cast(value, variable.dtype))
    return keras_add(variable, value)
  assign_add.tfdist_atomic_on_ps = True
  core.Variable.assign_add = assign_add


def _routed(method):
  @functools.wraps(method)
  def call(model, *args, **kwargs):
    import tensorflow as tf
    strategy = getattr(model, "_distribute_strategy", None)
    if not isinstance(strategy, tf.distribute.ParameterServerStrategy):
      return method(model, *args, **kwargs)
    bound = inspect.signature(method).bind(model, *args, **kwargs)
    bound.apply_defaults()
    defaults = {name: p.default for name, p in inspect.signature(method).parameters.items()}
    given = {name: value for name, value in bound.arguments.items()
             if name not in ("self", "kwargs") and value is not defaults[name]}
    return _RUN[method.__name__](model, strategy, bound.arguments, given)
  call.tfdist_parameter_servers = True
  return call


def _fit(model, strategy, arguments, given):
  from tfdist.training import data, keras_arguments, parameter_server
  keras_arguments.refuse("fit", given, keras_arguments.PARAMETER_SERVER)
  x, y, _, validation = keras_arguments.split_validation(
      arguments["x"], arguments["y"], None, validation_split=arguments["validation_split"],
      validation_data=arguments["validation_data"])
  batch_size = _keras_batch(arguments, x)
  return parameter_server.fit(
      model, strategy, x, y, batch_size=batch_size, epochs=arguments["epochs"],
      initial_epoch=arguments["initial_epoch"], steps_per_epoch=arguments["steps_per_epoch"],
      steps_per_execution=model.steps_per_execution,
      validation=data.validation_dataset(validation, None,
                                         arguments["validation_batch_size"] or batch_size),
      callbacks=list(arguments["callbacks"] or []), verbose=arguments["verbose"])


def _evaluate(model, strategy, arguments, given):
  from tfdist.training import data, keras_arguments, parameter_server
  keras_arguments.refuse("evaluate", given, keras_arguments.PARAMETER_SERVER)
  dataset = data.make_dataset(arguments["x"], arguments["y"], strategy=None,
                              batch_size=_keras_batch(arguments, arguments["x"]),
                              method="evaluate")
  return parameter_server.evaluate(model, dataset, return_dict=arguments["return_dict"])


def _predict(model, strategy, arguments, given):
  from tfdist.training import data, keras_arguments, parameter_server
  keras_arguments.refuse("predict", given, keras_arguments.PARAMETER_SERVER)
  dataset = data.make_dataset(arguments["x"], strategy=None,
                              batch_size=_keras_batch(arguments, arguments["x"]),
                              method="predict")
  return parameter_server.predict(model, dataset)


def _keras_batch(arguments, x) -> int | None:
  """The call's `batch_size`, or Keras's own default for arrays (32)."""
  from tfdist.training import data
  return arguments["batch_size"] or (_KERAS_BATCH if data.is_arrays(x) else None)


_KERAS_BATCH = 32  # Keras's fit, evaluate, predict: "batch_size will default to 32".
_RUN = {"fit": _fit, "evaluate": _evaluate, "predict": _predict}
