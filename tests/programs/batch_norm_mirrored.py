"""A model with BatchNormalization and Dropout trained over 2 logical CPUs, by plain Keras
(no tfdist) under its own MirroredStrategy, or by `tfdist.fit` on mirrored with its weights
sharded (ZeRO stage 3): each replica normalises its own half batch, so plain Keras's
MirroredStrategy is the reference, not one device. Writes every weight (the moving mean and
variance among them) and the per-epoch losses to OUT.npz.

Usage: python -m tests.programs.batch_norm_mirrored plain|stage_3 OUT.npz"""

import sys

import numpy as np
import tensorflow as tf

tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)


def model_fn():
  import keras
  keras.utils.set_random_seed(6)
  model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32),
                            keras.layers.BatchNormalization(), keras.layers.Activation("relu"),
                            keras.layers.Dense(2)])
  model.compile(optimizer=keras.optimizers.Adam(0.01),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  return model


def main(mode: str, out: str) -> None:
  from tests.programs import custom_loop
  x, y = custom_loop.data()
  if mode == "plain":
    from tfdist.training import keras_fixes
    with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
      model = model_fn()
    with keras_fixes.without_fixes():  # Keras's own fit, as without tfdist.
      history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
  else:
    import tfdist
    history = tfdist.fit(model_fn, x, y, shuffle=False, verbose=0, config={
        "strategy": "mirrored", "devices": {"logical_cpus": 2},
        "training": {"global_batch_size": 32, "epochs": 2, "mixed_precision": "off",
                     "steps_per_execution": 1, "zero_stage": 3}})
    model = history.model
  np.savez(out, losses=history.history["loss"],
           **{f"w{i}": w for i, w in enumerate(model.get_weights())})


if __name__ == "__main__":
  main(*sys.argv[1:])
