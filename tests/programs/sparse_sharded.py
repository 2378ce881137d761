"""A user's bag-of-words classifier (an Embedding, pooled, a Dense): its Embedding's gradient
is sparse (IndexedSlices, a row per token looked up, a token repeated within a batch and across
replicas), trained by `tfdist.fit` under the launched config, and its distance from plain Keras
on one device: prints `MAX_DIFF x`.

Usage: python -m tests.programs.sparse_sharded OPTIMIZER (under `tfdist launch`)"""

import sys

import numpy as np

OPTIMIZERS = {"adam": lambda keras: keras.optimizers.Adam(0.01),
              "adagrad": lambda keras: keras.optimizers.Adagrad(0.1),
              "sgd_momentum": lambda keras: keras.optimizers.SGD(0.1, momentum=0.9)}
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


def main(optimizer: str) -> None:
  import tfdist
  tokens, labels = data()
  model = tfdist.fit(model_fn, tokens, labels, shuffle=False, verbose=0,
                     compile=lambda: compile_args(optimizer)).model
  print(f"MAX_DIFF {max_diff(model, optimizer)}", flush=True)


if __name__ == "__main__":
  main(*sys.argv[1:])
