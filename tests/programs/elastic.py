"""A worker gone for good, for the elastic launch tests: the equivalence model trained with
SGD over 288 rows, a global batch of 48 (16 a replica over 3 workers, 24 over 2), 4 epochs,
unshuffled, by `tfdist.fit` or (LOOP=1) `tfdist.TrainingLoop`; the chief prints `RESULT <json
weights>`, every task `EPOCH_BEGIN e`.

With GONE=worker-N and MARKER=PATH, that worker fails with exit code 1 as epoch GONE_AT
(0-based, default 2) begins, leaving PATH; started again (PATH there), it prints "its host's data is gone" and
exits 1 right after `import tfdist`: gone for good. With ONCE=1 it fails the first time only.
PAUSE=S sleeps S seconds as each epoch begins (time for a launcher to come back). CONFIG=PATH
loads that config file by path, as a user's script does.

    python elastic.py
"""

import json
import os
import sys
import time

import tfdist  # Makes the strategy of a launched task first.

ROWS, GLOBAL_BATCH, EPOCHS = 288, 48, 4
GONE_AT = int(os.environ.get("GONE_AT", "2"))


def _gone_for_good() -> bool:
  task = tfdist.task()
  return task is not None and task.name == os.environ.get("GONE") and \
      os.path.exists(os.environ["MARKER"]) and not os.environ.get("ONCE")


def _leave_at(epoch: int) -> None:
  task = tfdist.task()
  if epoch == GONE_AT and task is not None and task.name == os.environ.get("GONE") and \
      not os.path.exists(os.environ["MARKER"]):
    open(os.environ["MARKER"], "w").close()
    print(f"{task.name}: leaving at epoch {epoch}", flush=True)
    os._exit(1)  # As a host that goes away.


def data():
  import numpy as np
  rng = np.random.default_rng(0)
  x = rng.normal(size=(ROWS, 8)).astype("float32")
  return x, (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype("int32")


def compile_args():
  import keras
  return dict(optimizer=keras.optimizers.SGD(0.1),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def train_fit(config):
  import keras
  from tests.programs import equivalence_case as case

  def begin(epoch, logs):
    _leave_at(epoch)
    print(f"EPOCH_BEGIN {epoch}", flush=True)
    time.sleep(float(os.environ.get("PAUSE", "0")))
  x, y = data()
  history = tfdist.fit(case.model_fn, x, y, config=config, compile=compile_args,
                       batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                       callbacks=[keras.callbacks.LambdaCallback(on_epoch_begin=begin)])
  return history.model.get_weights()


def train_loop(config):
  import keras
  import tensorflow as tf
  from tests.programs import equivalence_case as case
  loop = tfdist.TrainingLoop(config)
  with loop.scope():
    model = case.model_fn()
    optimizer = keras.optimizers.SGD(0.1)
  loop.prepare(model, optimizer)
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  def step(x, y):
    with tf.GradientTape() as tape:
      loss = loss_fn(y, model(x, training=True))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                  model.trainable_variables))
    return {"loss": loss}
  x, y = data()
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(loop.global_batch_size)
  for epoch in loop.epochs(EPOCHS):
    _leave_at(epoch)
    print(f"EPOCH_BEGIN {epoch}", flush=True)
    for _ in loop.run(step, dataset, steps=ROWS // GLOBAL_BATCH):
      pass
  return model.get_weights()


def train_plain():
  """The reference: plain Keras on one device, no tfdist."""
  from tests.programs import equivalence_case as case
  model = case.model_fn()
  model.compile(**compile_args())
  model.fit(*data(), batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
  return model.get_weights()


if __name__ == "__main__":
  if _gone_for_good():
    print("its host's data is gone", file=sys.stderr, flush=True)
    sys.exit(1)
  # As the fit how-to shows: the config by path (CONFIG) when given, else the launch's.
  config = tfdist.load_config(os.environ.get("CONFIG"))
  weights = (train_loop if os.environ.get("LOOP") else train_fit)(config)
  task = tfdist.task()
  if task is None or task.index == 0:
    print("RESULT " + json.dumps([w.tolist() for w in weights]), flush=True)
