"""Measures one training step of small models of each family the estimate must get right and
prints `RESULT <json>` a model: the step's estimated bytes on top of the variables
(activations kept, working memory, gradients) and the measured ones (TensorFlow's allocator
peak during `train_on_batch` less what was allocated before it). Run with
TF_CPU_ALLOCATOR_USE_BFC=true, so the CPU allocator keeps statistics.

    python memory_peak.py lstm gru attention embedding nested logits
"""

import gc
import json
import sys

import keras
import numpy as np
import tensorflow as tf

from tfdist.parallel import estimates


def recurrent(layer):
  inputs = keras.Input((600, 8))
  return keras.Model(inputs, keras.layers.Dense(1)(layer(64)(inputs))), 16, "mse"


def attention():
  inputs = keras.Input((256, 32))
  attended = keras.layers.MultiHeadAttention(num_heads=4, key_dim=8)(inputs, inputs)
  outputs = keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(attended))
  return keras.Model(inputs, outputs), 8, "mse"


def embedding():
  return keras.Sequential([keras.Input((100,), dtype="int32"), keras.layers.Embedding(5000, 64),
                           keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)]), 128, \
      "mse"


def nested():
  block = keras.Sequential([keras.Input((256,)), keras.layers.Dense(2048, activation="relu"),
                            keras.layers.Dense(256)], name="block")
  inputs = keras.Input((256,))
  return keras.Model(inputs, keras.layers.Dense(1)(block(inputs))), 512, "mse"


def logits():  # A language model's head: the loss keeps batch x positions x vocabulary.
  inputs = keras.Input((64,), dtype="int32")
  x = keras.layers.Embedding(8000, 32)(inputs)
  return keras.Model(inputs, keras.layers.Dense(8000)(x)), 16, \
      keras.losses.SparseCategoricalCrossentropy(from_logits=True)


MODELS = {"lstm": lambda: recurrent(keras.layers.LSTM),
          "gru": lambda: recurrent(keras.layers.GRU), "attention": attention,
          "embedding": embedding, "nested": nested, "logits": logits}


def measure(name):
  keras.utils.set_random_seed(0)
  model, batch, loss = MODELS[name]()
  model.compile(keras.optimizers.Adam(), loss, jit_compile=False)
  plan = estimates.estimate_memory(model, batch=batch, devices=1)["data_parallel"]
  rng = np.random.default_rng(0)
  x = (rng.integers(0, 2, (batch, *model.input_shape[1:])).astype("int32")
       if model.inputs[0].dtype == "int32" else
       rng.random((batch, *model.input_shape[1:]), dtype=np.float32))
  sparse = not isinstance(loss, str)
  y = (rng.integers(0, 2, (batch, *model.output_shape[1:-1])).astype("int32") if sparse
       else rng.random((batch, *model.output_shape[1:]), dtype=np.float32))
  model.train_on_batch(x, y)
  tf.config.experimental.reset_memory_stats("CPU:0")
  before = tf.config.experimental.get_memory_info("CPU:0")["current"]
  model.train_on_batch(x, y)
  measured = tf.config.experimental.get_memory_info("CPU:0")["peak"] - before
  return {"model": name, "estimated": plan.activations + plan.working + plan.gradients,
          "activations": plan.activations, "measured": measured}


if __name__ == "__main__":
  for name in sys.argv[1:]:
    print("RESULT " + json.dumps(measure(name)), flush=True)
    keras.backend.clear_session()
    gc.collect()
