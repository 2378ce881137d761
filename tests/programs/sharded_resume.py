"""Trains the sharded-optimizer test's model with `tfdist.fit` on mirrored over N logical CPUs,
Adam's state sharded, backing up to a checkpoint folder (so a later run resumes there), then
writes the weights to an .npz file.

With PREEMPT, the process sends itself SIGTERM when the first epoch ends: tfdist saves the
backup and exits 42, as under a preemption. STAGE=2 in the environment shards the gradients
too (`training.zero_stage: 2`), STAGE=3 the weights as well (`training.zero_stage: 3`).

Usage: sharded_resume.py LOGICAL_CPUS EPOCHS CHECKPOINT_DIR OUT.npz [PREEMPT]"""

import sys

import numpy as np


def config(logical_cpus: int, epochs: int, checkpoint_dir: str) -> dict:
  import os
  return {"strategy": "mirrored", "devices": {"logical_cpus": logical_cpus},
          "checkpoint": {"dir": checkpoint_dir},
          "training": {"global_batch_size": 96, "epochs": epochs, "mixed_precision": "off",
                       "steps_per_execution": 1, "zero_stage": int(os.environ.get("STAGE") or 1)}}


def model_fn():
  import keras
  keras.utils.set_random_seed(3)
  model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                            keras.layers.Dense(2)])
  model.compile(optimizer=keras.optimizers.Adam(0.01),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  return model


def plain(epochs: int):
  """The reference: plain Keras on one device, uninterrupted, no tfdist."""
  from tests.programs import custom_loop
  x, y = custom_loop.data()
  model = model_fn()
  model.fit(x[:192], y[:192], batch_size=96, epochs=epochs, shuffle=False, verbose=0)
  return model


def train(logical_cpus: int, epochs: int, checkpoint_dir: str, preempt: bool = False):
  import os
  import signal

  import keras
  import tfdist
  from tests.programs import custom_loop

  preemption = keras.callbacks.LambdaCallback(
      on_epoch_end=lambda epoch, logs: os.kill(os.getpid(), signal.SIGTERM))
  x, y = custom_loop.data()
  return tfdist.fit(model_fn, x[:192], y[:192], shuffle=False, verbose=0,
                    callbacks=[preemption] if preempt else [],
                    config=config(logical_cpus, epochs, checkpoint_dir))


def main(logical_cpus, epochs, checkpoint_dir, out, preempt=""):
  history = train(int(logical_cpus), int(epochs), checkpoint_dir, preempt == "PREEMPT")
  model = history.model
  print("REPLICAS", model.distribute_strategy.num_replicas_in_sync, flush=True)
  print("EPOCHS", history.epoch, flush=True)
  np.savez(out, *model.get_weights())


if __name__ == "__main__":
  main(*sys.argv[1:])
