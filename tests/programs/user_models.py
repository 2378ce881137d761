"""Models a user writes: Keras's "Customizing what happens in fit()" guide's own steps."""

import keras
import tensorflow as tf


class GuidesOwnStep(keras.Model):
  """The guide's `train_step` and `test_step`: the loss and every metric updated by hand, their
  results returned (the compiled ones nested under "compile_metrics")."""

  def train_step(self, data):
    x, y = data
    with tf.GradientTape() as tape:
      y_pred = self(x, training=True)
      loss = self.compute_loss(y=y, y_pred=y_pred)
    gradients = tape.gradient(loss, self.trainable_variables)
    self.optimizer.apply(gradients, self.trainable_variables)
    return self._updated(loss, y, y_pred)

  def test_step(self, data):
    x, y = data
    y_pred = self(x, training=False)
    return self._updated(self.compute_loss(y=y, y_pred=y_pred), y, y_pred)

  def _updated(self, loss, y, y_pred):
    for metric in self.metrics:
      if metric.name == "loss":
        metric.update_state(loss)
      else:
        metric.update_state(y, y_pred)
    return {m.name: m.result() for m in self.metrics}
