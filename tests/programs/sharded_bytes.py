"""Every variable this process holds, by device, after `tfdist.fit` trained a model with Adam on
mirrored over N logical CPUs, and the distance to plain Keras's weights on one device.

Prints `HELD {device: bytes}` (every TensorFlow variable alive but the model's weights, counted
from the garbage collector's objects; with `parameters`, stage 3, every variable alive after
`tfdist.fit` returned and Keras's own evaluate, predict and save ran, the model's sharded
weights among them), `WEIGHTS bytes` (the model's, one copy), `SLOTS bytes`
(Adam's two moments unsharded: twice the weights), `MAX_DIFF x` (the largest difference
from plain Keras) and `COLLECTIVES {op type: elements}`: the elements each kind of collective
op takes in, over every op TensorFlow put in a traced function during the fit
(`tests.traced`: what ran is seen, not what tfdist says).

Usage: python -m tests.programs.sharded_bytes N off|optimizer|gradients|parameters [SAVED]
(under `tfdist launch`: the launched config's strategy and training; SAVED: the trained model
saved there by `model.save`, the chief's file)"""

import json
import sys

import numpy as np


def model_fn():
  import keras
  keras.utils.set_random_seed(3)
  return keras.Sequential([keras.Input((16,)), keras.layers.Dense(200, activation="relu"),
                           keras.layers.Dense(2)])


def compile_args():
  import keras
  return dict(optimizer=keras.optimizers.Adam(0.01),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def plain():
  from tests.programs import custom_loop
  model = model_fn()
  model.compile(**compile_args())
  x, y = custom_loop.data()
  model.fit(x[:192], y[:192], batch_size=96, epochs=2, shuffle=False, verbose=0)
  return model.get_weights()


def main(replicas: str, mode: str, saved: str = "") -> None:
  import tfdist
  from tfdist.testing import held_beyond_weights, held_variables
  from tests import traced
  from tests.programs import custom_loop
  config = tfdist.load_config() if tfdist.task() else {  # Launched: the cluster's config.
      "strategy": "mirrored", "devices": {"logical_cpus": int(replicas)},
      "training": {"global_batch_size": 96, "epochs": 2, "mixed_precision": "off",
                   "steps_per_execution": 1, "fused_optimizer": False,
                   "zero_stage": {"off": 0, "optimizer": 1, "gradients": 2, "parameters": 3}[mode]}}
  x, y = custom_loop.data()
  with traced.collectives() as collectives:
    model = tfdist.fit(model_fn, x[:192], y[:192], config=config, shuffle=False, verbose=0,
                       compile=compile_args).model
  if saved:  # Every worker saves (a collective gathers the optimizer's shards); one file.
    model.save(saved)
  # Stage 3's model after fit returned, Keras's own evaluate and predict run on it, and saved.
  model.evaluate(x[192:], y[192:], verbose=0)
  model.predict(x[192:], verbose=0)
  held = held_variables() if mode == "parameters" else held_beyond_weights(model)
  one = sum(w.numpy().nbytes for w in model.weights)
  print("HELD " + json.dumps(held), flush=True)
  print("COLLECTIVES " + json.dumps(traced.by_type(collectives)), flush=True)
  print(f"WEIGHTS {one}\nSLOTS {2 * one}", flush=True)
  diff = max(float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), plain(),
                                                          strict=True))
  print(f"MAX_DIFF {diff}", flush=True)


if __name__ == "__main__":
  main(*sys.argv[1:])
