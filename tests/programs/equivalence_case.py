"""One model, seed and data, trained under any config: the equivalence tests compare the
results across strategies. Run as a script it trains under the environment's config (a task
of a launched cluster) and prints the results as JSON."""

import json

import numpy as np

import tfdist

EPOCHS = 3
GLOBAL_BATCH = 32


def data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(256, 8)).astype("float32")
  y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype("int32")
  return x, y


def model_fn():
  import keras
  init = keras.initializers.GlorotUniform
  return keras.Sequential([
      keras.Input((8,)),
      keras.layers.Dense(16, activation="relu", kernel_initializer=init(1)),
      keras.layers.Dense(2, kernel_initializer=init(2)),
  ])


def compile_args():
  import keras
  return dict(optimizer=keras.optimizers.SGD(0.1),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")])


def train(config):
  x, y = data()
  history = tfdist.fit(model_fn, x, y, config=config, compile=compile_args,
                       batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
  model = history.model
  evaluation = tfdist.evaluate(model, x, y, batch_size=GLOBAL_BATCH, verbose=0)
  predictions = tfdist.predict(model, x[:40], batch_size=GLOBAL_BATCH, verbose=0)
  return {"history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
          "evaluate": [float(v) for v in evaluation],
          "predict": np.asarray(predictions).tolist(),
          "weights": [w.tolist() for w in model.get_weights()]}


if __name__ == "__main__":
  print("RESULT " + json.dumps(train(tfdist.load_config())), flush=True)
