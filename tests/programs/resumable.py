"""Trains the equivalence model with Adam, shuffled, under the environment's config (which names
a checkpoint directory), printing `EPOCH_BEGIN e` / `EPOCH_END e` (0-based, flushed; EPOCH_END
comes after the backup is written) and finally `RESULT <json weights>`.

With PAUSE_AFTER_EPOCH=k, task worker-1 sleeps after finishing epoch k (1-based) so a test can
kill it there. With CSV_LOG=PATH, a user's CSVLogger (Keras's default append=False) logs there."""

import json
import os
import time

import numpy as np

import tfdist
from tests.programs import equivalence_case as case

EPOCHS = 6
SEED = 7


def compile_args():
  import keras
  return dict(optimizer=keras.optimizers.Adam(0.01),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def train(config, callbacks=()):
  x, y = case.data()
  config = case.with_training(config, **case.BASE, seed=SEED)
  history = tfdist.fit(case.model_fn, x, y, config=config, compile=compile_args,
                       batch_size=case.GLOBAL_BATCH, epochs=EPOCHS, callbacks=list(callbacks),
                       verbose=0)
  return history.model


class Progress:
  def __new__(cls, task):
    import keras
    pause = int(os.environ.get("PAUSE_AFTER_EPOCH", "0"))

    def end(epoch, logs):
      print(f"EPOCH_END {epoch}", flush=True)
      if task == "worker-1" and epoch + 1 == pause:
        time.sleep(600)
    return keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: print(f"EPOCH_BEGIN {epoch}", flush=True),
        on_epoch_end=end)


if __name__ == "__main__":
  print(f"PID {os.getpid()}", flush=True)
  config = tfdist.load_config()
  import keras
  csv = [keras.callbacks.CSVLogger(os.environ["CSV_LOG"])] if "CSV_LOG" in os.environ else []
  model = train(config, [Progress(f"{config.task.type}-{config.task.index}"), *csv])
  print("RESULT " + json.dumps([np.asarray(w).tolist() for w in model.get_weights()]),
        flush=True)
