"""Metrics a user writes: `keras.metrics.Metric` subclasses with their own variables."""

import keras
import tensorflow as tf


class RowsSeen(keras.metrics.Metric):
  """A user's metric: a total of rows kept in a variable, its result the variable itself."""

  def __init__(self, name="rows_seen", **kwargs):
    super().__init__(name=name, **kwargs)
    self.total = self.add_variable(shape=(), initializer="zeros", name="total")

  def update_state(self, y_true, y_pred, sample_weight=None):
    self.total.assign_add(tf.cast(tf.shape(y_pred)[0], self.total.dtype))

  def result(self):
    return self.total


class MeanMargin(keras.metrics.Metric):
  """A user's mean: the mean of each row's absolute logit."""

  def __init__(self, name="mean_margin", **kwargs):
    super().__init__(name=name, **kwargs)
    self.sum = self.add_variable(shape=(), initializer="zeros", name="sum")
    self.count = self.add_variable(shape=(), initializer="zeros", name="count")

  def update_state(self, y_true, y_pred, sample_weight=None):
    self.sum.assign_add(tf.reduce_sum(tf.abs(y_pred)))
    self.count.assign_add(tf.cast(tf.shape(y_pred)[0], "float32"))

  def result(self):
    return self.sum / self.count
