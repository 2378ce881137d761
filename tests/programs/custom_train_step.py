"""A keras.Model subclass with its own train_step, as Keras's "customizing what happens in fit"
guide writes one, trained with tfdist.fit. Two styles: `tf.reduce_mean` of the per-example
loss, or Keras's `self.compute_loss`.

    python custom_train_step.py OUT_DIR [reduce_mean|compute_loss]

Under the launcher's config; the chief writes OUT_DIR/result.npz (weights, loss per epoch).
"""

import os
import sys

import keras
import numpy as np
import tensorflow as tf

import tfdist


class MyModel(keras.Model):
  style = "reduce_mean"

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.loss_tracker = keras.metrics.Mean(name="loss")  # The guide's own loss metric.

  @property
  def metrics(self):
    return [self.loss_tracker]

  def train_step(self, data):
    x, y = data
    with tf.GradientTape() as tape:
      logits = self(x, training=True)
      if self.style == "reduce_mean":
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
            y, logits, from_logits=True))
      else:
        loss = self.compute_loss(x=x, y=y, y_pred=logits)
    gradients = tape.gradient(loss, self.trainable_variables)
    self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
    self.loss_tracker.update_state(loss)
    return {"loss": self.loss_tracker.result()}


def data():
  rng = np.random.default_rng(1)
  x = rng.random((256, 16), dtype=np.float32)
  return x, (x[:, :8].sum(axis=1) > 4).astype("int32")


def make_model(style):
  keras.utils.set_random_seed(4)
  inputs = keras.Input((16,))
  model = MyModel(inputs, keras.layers.Dense(2)(keras.layers.Dense(16, activation="relu")(
      inputs)))
  model.style = style
  return model


def compile_args(momentum=0.0):
  return dict(optimizer=keras.optimizers.SGD(0.5 if not momentum else 0.1, momentum=momentum),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def train(config=None, style="reduce_mean", momentum=0.0):
  x, y = data()
  history = tfdist.fit(lambda: make_model(style), x, y, config=config, shuffle=False, epochs=3,
                       verbose=0, compile=lambda: compile_args(momentum))
  return [w.numpy() for w in history.model.weights], history.history["loss"]


def train_plain(style="reduce_mean", batch_size=32, momentum=0.0):
  """The same training by plain Keras's `model.fit` on one device: the reference."""
  model = make_model(style)
  model.compile(**compile_args(momentum))
  history = model.fit(*data(), batch_size=batch_size, epochs=3, shuffle=False, verbose=0)
  return [w.numpy() for w in model.weights], history.history["loss"]


if __name__ == "__main__":
  out = sys.argv[1]
  weights, losses = train(style=sys.argv[2] if len(sys.argv) > 2 else "reduce_mean")
  if tfdist.is_chief():
    os.makedirs(out, exist_ok=True)
    np.savez(os.path.join(out, "result.npz"), losses=losses,
             **{f"w{i}": w for i, w in enumerate(weights)})
