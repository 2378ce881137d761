"""A Keras script whose input pipeline sleeps on one task: the straggler to name.

    python straggler.py SLOW_TASK SLEEP_SECONDS    (SLOW_TASK: worker-1, or none)

Under `tfdist launch` with a config whose `tensorboard.log_dir` is set.
"""

import sys
import time

import keras
import numpy as np
import tensorflow as tf

import tfdist

SLOW_TASK, SLEEP = sys.argv[1], float(sys.argv[2])
rng = np.random.default_rng(0)
x, y = rng.random((2048, 32), dtype=np.float32), rng.integers(0, 10, 2048).astype("int32")


def sleep(batch_x, batch_y):
  time.sleep(SLEEP)
  return batch_x, batch_y


dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)
if tfdist.task().name == SLOW_TASK:  # This worker's pipeline is the slow one.
  dataset = dataset.map(lambda a, b: tf.numpy_function(sleep, [a, b], [tf.float32, tf.int32]))
  dataset = dataset.map(lambda a, b: (tf.ensure_shape(a, [None, 32]), tf.ensure_shape(b, [None])))
tfdist.fit(lambda: keras.Sequential([keras.Input((32,)), keras.layers.Dense(64, activation="relu"),
                                     keras.layers.Dense(10)]),
           dataset.prefetch(2),
           compile=lambda: dict(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(
               from_logits=True)), verbose=2)
