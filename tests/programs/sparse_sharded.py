"""A user's bag-of-words classifier (an Embedding, pooled, a Dense): its Embedding's gradient
is sparse (IndexedSlices, a row per token looked up, a token repeated within a batch and across
replicas), trained by `tfdist.fit` under the launched config, and its distance from plain Keras
on one device: prints `MAX_DIFF x`.

Usage: python -m tests.programs.sparse_sharded OPTIMIZER (under `tfdist launch`)
       python -m tests.programs.sparse_sharded keras_mirrored OUT.npz: the Transformer example
       (`transformer_fn`) trained one epoch by plain Keras's own MirroredStrategy over 2 logical
       CPUs, its weights saved to OUT.npz"""

import sys

import numpy as np

OPTIMIZERS = {"adam": lambda keras: keras.optimizers.Adam(0.01),
              "adagrad": lambda keras: keras.optimizers.Adagrad(0.1),
              "sgd_momentum": lambda keras: keras.optimizers.SGD(0.1, momentum=0.9),
              "sgd": lambda keras: keras.optimizers.SGD(0.1)}
BATCH, EPOCHS = 32, 2


def data():
  """Tokens of a vocabulary of 30, 8 a row, each row's label the parity of its tokens' sum:
  tokens repeat within rows and batches, and rows of both labels share them (their gradients
  cancel in part: a row's summed gradient is not its squared parts' root)."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 30, (128, 8)).astype("int32")
  return tokens, (tokens.sum(1) % 2).astype("int32")


def model_fn():
  import keras
  keras.utils.set_random_seed(3)
  inputs = keras.Input((8,), dtype="int32")
  pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(30, 4)(inputs))
  return keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Dense(6, "relu")(pooled)))


def transformer_fn():
  """Keras's "Text classification with Transformer" example, smaller and without dropout: a
  token and a position embedding (the positions looked up once for the whole batch: a sparse
  gradient of one row per replica), multi-head attention, layer normalisation."""
  import keras
  from keras import layers, ops

  class TokenAndPositionEmbedding(layers.Layer):
    def __init__(self, maxlen, vocab_size, embed_dim):
      super().__init__()
      self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
      self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

    def call(self, x):
      positions = self.pos_emb(ops.arange(start=0, stop=ops.shape(x)[-1], step=1))
      return self.token_emb(x) + positions

  class TransformerBlock(layers.Layer):
    def __init__(self, embed_dim, num_heads, ff_dim):
      super().__init__()
      self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
      self.ffn = keras.Sequential([layers.Dense(ff_dim, activation="relu"),
                                   layers.Dense(embed_dim)])
      self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
      self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)

    def call(self, inputs):
      out1 = self.layernorm1(inputs + self.att(inputs, inputs))
      return self.layernorm2(out1 + self.ffn(out1))

  keras.utils.set_random_seed(3)
  inputs = layers.Input(shape=(8,))
  x = TransformerBlock(8, 2, 8)(TokenAndPositionEmbedding(8, 30, 8)(inputs))
  x = layers.Dense(6, activation="relu")(layers.GlobalAveragePooling1D()(x))
  return keras.Model(inputs, layers.Dense(2)(x))


def compile_args(optimizer: str):
  import keras
  return dict(optimizer=OPTIMIZERS[optimizer](keras),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def plain(optimizer: str) -> list:
  """Plain Keras's weights on one device: the same model, data, batches and epochs."""
  from tfdist.training import keras_fixes
  model = model_fn()
  model.compile(**compile_args(optimizer))
  tokens, labels = data()
  with keras_fixes.without_fixes():
    model.fit(tokens, labels, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
  return model.get_weights()


def max_diff(model, optimizer: str) -> float:
  return max(float(np.abs(a - b).max())
             for a, b in zip(model.get_weights(), plain(optimizer), strict=True))


def keras_mirrored(out: str) -> None:
  import tensorflow as tf
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
  tokens, labels = data()
  with tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"]).scope():
    model = transformer_fn()
    model.compile(**compile_args("adam"))
  model.fit(tokens, labels, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
  np.savez(out, *model.get_weights())


def main(optimizer: str, out: str = "") -> None:
  if optimizer == "keras_mirrored":
    return keras_mirrored(out)
  import tfdist
  tokens, labels = data()
  model = tfdist.fit(model_fn, tokens, labels, shuffle=False, verbose=0,
                     compile=lambda: compile_args(optimizer)).model
  print(f"MAX_DIFF {max_diff(model, optimizer)}", flush=True)


if __name__ == "__main__":
  main(*sys.argv[1:])
