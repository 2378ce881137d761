"""Adam, AdamW and SGD updates with TensorFlow's fused kernels, for tfdist's own optimizers.

Keras 3 writes each optimizer update as a dozen elementwise ops per variable; tf.keras 2 ran one
fused kernel (`ResourceApplyAdam`, ...). On the benchmarks' MLP Keras's Adam update takes 1.9 ms
a step, the fused kernel 0.6 ms, forward and backward in bfloat16 3.5 ms
(benchmarks/bench_optimizer_update.py). The kernels compute the same formulas in the same order;
tests/test_fused_updates.py compares them with Keras's update and fails when Keras changes one.

`install` sets the fused step on one optimizer object (the one `tfdist.fit` compiled), never on
the class. Other optimizers, AMSGrad and sparse gradients keep Keras's own update.
"""

from __future__ import annotations

import types

import keras
import tensorflow as tf


def install(optimizer) -> bool:
  """Makes `optimizer` (or the optimizer a LossScaleOptimizer wraps) update its variables with
  a fused kernel; returns False, changing nothing, when it has none for that optimizer."""
  optimizer = getattr(optimizer, "inner_optimizer", optimizer)
  if keras.backend.backend() != "tensorflow":
    return False
  update_step = type(optimizer).update_step
  if update_step is keras.optimizers.Adam.update_step and not optimizer.amsgrad:
    fused = _adam
  elif update_step is keras.optimizers.SGD.update_step:
    fused = _sgd
  else:
    return False
  keras_step = optimizer.update_step

  def step(self, gradient, variable, learning_rate):
    if isinstance(gradient, tf.IndexedSlices):
      return keras_step(gradient, variable, learning_rate)
    return fused(self, gradient, _tf_variable(variable), learning_rate)

  optimizer.update_step = types.MethodType(step, optimizer)
  return True


def _tf_variable(variable):
  return variable.value if isinstance(variable, keras.Variable) else variable


def _slot(slots, optimizer, variable):
  """The optimizer's slot variable for `variable`; under a strategy's update, its handle is the
  one on the device being updated."""
  return _tf_variable(slots[optimizer._get_variable_index(variable)]).handle


def _adam(self, gradient, variable, learning_rate):
  dtype = variable.dtype
  step = tf.cast(self.iterations + 1, dtype)
  beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
  return tf.raw_ops.ResourceApplyAdam(
      var=variable.handle, m=_slot(self._momentums, self, variable),
      v=_slot(self._velocities, self, variable), beta1_power=tf.pow(beta_1, step),
      beta2_power=tf.pow(beta_2, step), lr=tf.cast(learning_rate, dtype), beta1=beta_1,
      beta2=beta_2, epsilon=tf.cast(self.epsilon, dtype), grad=tf.cast(gradient, dtype))


def _sgd(self, gradient, variable, learning_rate):
  dtype = variable.dtype
  learning_rate, gradient = tf.cast(learning_rate, dtype), tf.cast(gradient, dtype)
  if self.momentum == 0:
    return tf.raw_ops.ResourceApplyGradientDescent(var=variable.handle, alpha=learning_rate,
                                                   delta=gradient)
  return tf.raw_ops.ResourceApplyKerasMomentum(
      var=variable.handle, accum=_slot(self.momentums, self, variable), lr=learning_rate,
      grad=gradient, momentum=tf.cast(self.momentum, dtype), use_nesterov=self.nesterov)
