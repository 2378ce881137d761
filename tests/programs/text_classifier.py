"""A user's text classifier: strings in, TextVectorization inside the model (adapted before
the model is built), an Embedding and a GRU, trained with tfdist.fit under the launcher's
config; the chief saves OUT_DIR/text.keras.

    python text_classifier.py OUT_DIR
"""

import os
import sys

import keras
import numpy as np
import tensorflow as tf

import tfdist

OUT = sys.argv[1]
WORDS = ["good", "great", "fine", "bad", "awful", "poor", "movie", "plot", "the", "a"]

rng = np.random.default_rng(0)
y = rng.integers(0, 2, 256).astype("int32")
x = np.array([" ".join(rng.choice((WORDS[:3] if label else WORDS[3:6]) + WORDS[6:], 6))
              for label in y])
vectorize = keras.layers.TextVectorization(max_tokens=20, output_sequence_length=8)
vectorize.adapt(x)


def make_model():
  keras.utils.set_random_seed(3)
  text = keras.Input((), dtype="string", name="text")
  hidden = keras.layers.GRU(8)(keras.layers.Embedding(20, 8)(vectorize(text)))
  return keras.Model(text, keras.layers.Dense(2, name="logits")(hidden))


dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(tfdist.global_batch_size())
history = tfdist.fit(make_model, dataset, verbose=2,
                     compile=lambda: dict(optimizer="adam", metrics=["accuracy"],
                                          loss=keras.losses.SparseCategoricalCrossentropy(
                                              from_logits=True)))
os.makedirs(OUT, exist_ok=True)
history.model.save(os.path.join(OUT, "text.keras"))
