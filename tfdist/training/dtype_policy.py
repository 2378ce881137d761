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
