"""Fits a small model with step backups due at every step, this task's backup writes slowed by
`SLOW_WRITE_<task>` seconds (a slow disk), and prints `BACKUPS <json>`: the (epoch, step) of
every step backup this task took within its epochs."""

import json
import os
import time

import keras
import numpy as np

import tfdist
from tfdist.config.roles import task_name
from tfdist.training import checkpoints

taken = []
save, write = checkpoints.Backup._save_model, checkpoints.write_weights


def recording(self, background=False):
  if background:  # The step backups (an epoch's end saves in the step).
    taken.append([self._current_epoch, self._last_batch_seen])
  return save(self, background)


def slowed(copy, path):
  time.sleep(float(os.environ.get(f"SLOW_WRITE_{task_name(tfdist.load_config())}", "0")))
  write(copy, path)


checkpoints.Backup._save_model, checkpoints.write_weights = recording, slowed
rng = np.random.default_rng(0)
x, y = rng.random((640, 8), dtype=np.float32), rng.random((640, 1), dtype=np.float32)
tfdist.fit(lambda: keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)]), x, y,
           compile=lambda: dict(optimizer="sgd", loss="mse"), epochs=3, batch_size=32,
           shuffle=False, verbose=0)
print("BACKUPS " + json.dumps(taken), flush=True)
