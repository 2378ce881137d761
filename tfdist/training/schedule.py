"""Linear learning-rate scaling with warm-up, as a Keras `LearningRateSchedule` wrapped around
the optimizer's own learning rate (a float or a schedule), so it runs inside the compiled step
under every strategy and is saved with the optimizer.
"""

from __future__ import annotations

import keras


@keras.saving.register_keras_serializable(package="tfdist")
class ScaledWarmup(keras.optimizers.schedules.LearningRateSchedule):
  """`base(step) * multiplier * min(1, (step + 1) / warmup_steps)`.

  With `warmup_steps=0` it is the scaled base rate; the ramp starts at 1/warmup_steps of it
  (Goyal et al., "Accurate, Large Minibatch SGD", use the same linear ramp).
  """

  def __init__(self, base, multiplier: float = 1.0, warmup_steps: int = 0):
    self.base = base
    self.multiplier = float(multiplier)
    self.warmup_steps = int(warmup_steps)

  def __call__(self, step):
    step = keras.ops.cast(step, "float32")
    base = self.base(step) if callable(self.base) else self.base
    rate = keras.ops.cast(base, "float32") * self.multiplier
    if self.warmup_steps:
      rate = rate * keras.ops.minimum(1.0, (step + 1.0) / self.warmup_steps)
    return rate

  def get_config(self):
    base = self.base
    if isinstance(base, keras.optimizers.schedules.LearningRateSchedule):
      base = keras.saving.serialize_keras_object(base)
    return {"base": base, "multiplier": self.multiplier, "warmup_steps": self.warmup_steps}

  @classmethod
  def from_config(cls, config):
    config = dict(config)
    if isinstance(config["base"], dict):
      config["base"] = keras.saving.deserialize_keras_object(config["base"])
    return cls(**config)


def scale_learning_rate(optimizer, multiplier: float, warmup_steps: int) -> None:
  """Replaces `optimizer`'s learning rate by the scaled, warmed-up one (before it is built)."""
  base = optimizer._learning_rate  # The float variable or the schedule the user gave.
  if isinstance(base, keras.Variable):
    base = float(base.value.numpy())
  optimizer.learning_rate = ScaledWarmup(base, multiplier, warmup_steps)
