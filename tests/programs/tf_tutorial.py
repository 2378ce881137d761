"""A script written as TensorFlow's "Multi-worker training with Keras" tutorial teaches, with no
tfdist in it: its own MultiWorkerMirroredStrategy, the model built and compiled in the strategy's
scope, Keras's own fit and evaluate. Unseeded shuffling aside (its orders differ per process),
as the tutorial writes it. Prints `RESULT <json>` (history, evaluation, weights)."""

import json
import os

import numpy as np
import tensorflow as tf

GLOBAL_BATCH = 32  # The tutorial's per-worker batch times the workers, the same in every run.


def dataset(global_batch_size):
  rng = np.random.default_rng(6)
  x = rng.normal(size=(512, 8)).astype("float32")
  y = (x[:, :4].sum(axis=1) > 0).astype("int64")
  return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(global_batch_size), (x, y)


def build_and_compile_model():
  init = tf.keras.initializers.GlorotUniform(seed=3)
  model = tf.keras.Sequential([
      tf.keras.layers.InputLayer(shape=(8,)),
      tf.keras.layers.Dense(16, activation="relu", kernel_initializer=init),
      tf.keras.layers.Dense(2, kernel_initializer=init)])
  model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                optimizer=tf.keras.optimizers.SGD(learning_rate=0.05),
                metrics=["accuracy"])
  return model


tf_config = json.loads(os.environ.get("TF_CONFIG", "{}"))
strategy = tf.distribute.MultiWorkerMirroredStrategy()
multi_worker_dataset, (x, y) = dataset(GLOBAL_BATCH)
with strategy.scope():
  multi_worker_model = build_and_compile_model()
history = multi_worker_model.fit(multi_worker_dataset, epochs=3, steps_per_epoch=12, verbose=0)
evaluation = multi_worker_model.evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0)
print("RESULT", json.dumps({"replicas": strategy.num_replicas_in_sync,
                            "history": history.history, "evaluate": evaluation,
                            "weights": [w.tolist() for w in multi_worker_model.get_weights()]}),
      flush=True)
