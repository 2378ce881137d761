"""The allocator's peak over training steps beyond what the process held before them, under
`tfdist.fit` on mirrored over N logical CPUs (TensorFlow's CPU allocator with statistics: BFC,
set here before TensorFlow starts). A 2.1 M-parameter MLP (8.4 MiB of float32) and a batch of
32: the steps' buffers are the gradients and their reduction, not the activations. Steps run
by `train_on_batch` on one batch held as a tensor (no input pipeline's buffers).

Prints `TRANSIENT_BYTES x` (the most the steps added over what was held before them),
`WEIGHT_BYTES x` and `MAX_DIFF x` (the largest difference from plain Keras's weights on one
device after the same steps), and `FIT_TRANSIENT_BYTES x`: the same peak over steps 2 to 4 of
`tfdist.fit` itself (its input pipeline included; stage 3's weights are sharded only there:
`tfdist.fit` gives them back whole when it ends), `FIT_PEAK_BYTES x`: the most the process's
allocator held at once over those steps (the variables, the step's buffers and the input
pipeline's together: what `tfdist estimate` totals, the pipeline apart), and `READ_COPY_BYTES x`: the most a read of one
of the model's trained weights allocates (0 unless the variable was left in TensorFlow's
copy-on-read mode, where every read, each forward pass's included, copies it whole);
`COLLECTIVES {op type: elements}` and `LARGEST_COLLECTIVES {op type: the most one op takes
in}` of the fit's traced functions (`tests.traced`).

Usage: python -m tests.programs.step_peak N off|optimizer|gradients|parameters [mlp|deep]
(under `tfdist launch`: the launched config's strategy and training, each task its own
process's figures; deep: 8 hidden layers of 512, 8 weights of 1 MiB)"""

import functools
import json
import os
import sys


def model_fn(deep: bool = False):
  import keras
  keras.utils.set_random_seed(1)
  hidden = [512] * 8 if deep else [1024, 1024]  # Deep: 8 weights of 1 MiB, 8.6 MiB in all.
  return keras.Sequential([keras.Input((1024,)), *(keras.layers.Dense(units, activation="relu")
                                                   for units in hidden), keras.layers.Dense(8)])


def compile_args():
  import keras
  return dict(optimizer=keras.optimizers.Adam(1e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def main(replicas: str, mode: str, model: str = "mlp") -> None:
  import keras
  import numpy as np
  import tensorflow as tf
  import tfdist
  from tests import traced

  config = tfdist.load_config() if tfdist.task() else {  # Launched: the cluster's config.
            "strategy": "mirrored", "devices": {"logical_cpus": int(replicas)},
            "training": {"global_batch_size": 32, "epochs": 1, "mixed_precision": "off",
                         "steps_per_execution": 1, "fused_optimizer": False,
                         "zero_stage": {"off": 0, "optimizer": 1, "gradients": 2, "parameters": 3}[mode]}}
  rng = np.random.default_rng(0)
  x = rng.normal(size=(64, 1024)).astype("float32")
  y = rng.integers(0, 8, size=(64,))
  measured = {}

  class Peak(keras.callbacks.Callback):  # Steps 2 to 4 of the fit (its first traces it).
    def on_train_batch_end(self, batch, logs=None):
      if batch == 0:
        tf.config.experimental.reset_memory_stats("CPU:0")
        measured["held"] = tf.config.experimental.get_memory_info("CPU:0")["current"]

    def on_train_end(self, logs=None):
      measured["peak"] = tf.config.experimental.get_memory_info("CPU:0")["peak"]
  build = functools.partial(model_fn, model == "deep")
  with traced.collectives() as collectives:
    model = tfdist.fit(build, np.concatenate([x, x]), np.concatenate([y, y]), config=config,
                       shuffle=False, verbose=0, callbacks=[Peak()], compile=compile_args).model
  for name, found in (("COLLECTIVES", traced.by_type(collectives)),
                      ("LARGEST_COLLECTIVES", traced.largest(collectives))):
    print(f"{name} {json.dumps(found, separators=(',', ':'))}", flush=True)
  print(f"FIT_TRANSIENT_BYTES {measured['peak'] - measured['held']}", flush=True)
  print(f"FIT_PEAK_BYTES {measured['peak']}", flush=True)
  copies = []
  held = getattr(model, "_tfdist_parameters", None)  # Stage 3: the shards are what it holds.
  for variable in [held.flat] if held else [v.value for v in model.trainable_variables]:
    for component in getattr(variable, "values", None) or [variable]:
      read = tf.function(lambda c=component: tf.reduce_sum(c.read_value()))
      read()  # Traced.
      tf.config.experimental.reset_memory_stats("CPU:0")
      before = tf.config.experimental.get_memory_info("CPU:0")["current"]
      read()
      copies.append(tf.config.experimental.get_memory_info("CPU:0")["peak"] - before)
  print(f"READ_COPY_BYTES {max(copies)}", flush=True)
  batch = (tf.constant(x[:32]), tf.constant(y[:32]))
  model.train_on_batch(*batch)  # Its own function traced.
  tf.config.experimental.reset_memory_stats("CPU:0")
  held = tf.config.experimental.get_memory_info("CPU:0")["current"]
  for _ in range(3):
    model.train_on_batch(*batch)
  peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
  print(f"TRANSIENT_BYTES {peak - held}", flush=True)
  print(f"WEIGHT_BYTES {sum(w.numpy().nbytes for w in model.weights)}", flush=True)
  # The reference: plain Keras on one device, the same batches in the same order.
  plain = build()
  plain.compile(**compile_args())
  plain.fit(np.concatenate([x, x]), np.concatenate([y, y]), batch_size=32, epochs=1,
            shuffle=False, verbose=0)
  for _ in range(4):
    plain.train_on_batch(*batch)
  diff = max(float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), plain.get_weights(),
                                                          strict=True))
  print(f"MAX_DIFF {diff}", flush=True)


if __name__ == "__main__":
  os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"  # Run, not imported (a test keeps its own).
  main(*sys.argv[1:])
