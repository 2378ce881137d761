"""A script written as Keras's "Multi-GPU distributed training with TensorFlow" guide teaches,
with no tfdist in it: `tf.distribute.MirroredStrategy()`, model built, compiled, fit and
evaluated inside its scope, validation data beside. Prints `RESULT <json>`."""

import json

import keras
import numpy as np
import tensorflow as tf


def get_compiled_model():
  init = keras.initializers.GlorotUniform(seed=3)
  inputs = keras.Input(shape=(8,))
  x = keras.layers.Dense(16, activation="relu", kernel_initializer=init)(inputs)
  outputs = keras.layers.Dense(2, kernel_initializer=init)(x)
  model = keras.Model(inputs, outputs)
  model.compile(optimizer=keras.optimizers.Adam(1e-2),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                metrics=[keras.metrics.SparseCategoricalAccuracy()])
  return model


def get_dataset():
  rng = np.random.default_rng(7)
  x = rng.normal(size=(320, 8)).astype("float32")
  y = (x[:, :4].sum(axis=1) > 0).astype("int64")
  return (tf.data.Dataset.from_tensor_slices((x[:256], y[:256])).batch(32),
          tf.data.Dataset.from_tensor_slices((x[256:], y[256:])).batch(32))


strategy = tf.distribute.MirroredStrategy()
print(f"Number of devices: {strategy.num_replicas_in_sync}", flush=True)
with strategy.scope():
  model = get_compiled_model()
train_dataset, val_dataset = get_dataset()
history = model.fit(train_dataset, epochs=3, validation_data=val_dataset, verbose=0)
print("RESULT", json.dumps({"history": history.history,
                            "evaluate": model.evaluate(val_dataset, verbose=0),
                            "weights": [w.tolist() for w in model.get_weights()]}), flush=True)
