"""A Keras dtype policy applied while a model is built, with the layers that produce its
outputs kept in float32 (the policy itself is chosen in `tfdist.machine.precision`)."""

from __future__ import annotations

import contextlib

from tfdist.machine.precision import FLOAT32


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


def _computing_in(model, policy: str) -> list:
  return [layer for layer in model._flatten_layers(include_self=True, recursive=True)
          if getattr(layer.dtype_policy, "name", None) == policy]


def _set(layers, policy: str) -> None:
  for layer in layers:
    layer.dtype_policy = policy


def give_back(model, chosen: str, built_with: str) -> None:
  """The layers of `model` computing in `chosen` (a policy tfdist chose for training) compute in
  `built_with` (the user's) from now on; the traced predict/evaluate functions are dropped, so
  the next call traces in the user's policy. The weights are float32 under either."""
  if chosen == built_with:
    return
  _set(_computing_in(model, chosen), built_with)
  for name in ("train_function", "test_function", "predict_function"):
    if hasattr(model, name):
      setattr(model, name, None)


@contextlib.contextmanager
def saved_as_built(model, chosen: str, built_with: str):
  """While inside, `model.save` (the user's ModelCheckpoint, a callback's save) writes the
  layers with the user's policy `built_with`, while training goes on in `chosen`."""
  if chosen == built_with:
    yield
    return
  own = vars(model).get("save")  # An instance's own save (a non-chief's, user_files).
  keras_save = model.save

  def save(*args, **kwargs):
    layers = _computing_in(model, chosen)
    _set(layers, built_with)
    try:
      return keras_save(*args, **kwargs)
    finally:
      _set(layers, chosen)
  model.save = save
  try:
    yield
  finally:
    if own is None:
      del model.save
    else:
      model.save = own
