"""Plain Keras (no tfdist) under its own MirroredStrategy over 2 logical CPUs, Adam with
`global_clipnorm` (or, with `float16`, SGD with momentum under Keras's mixed_float16 policy and
its loss scaling), the sharded-optimizer test's model and data; writes the weights to OUT.npz.
In a process of its own: a second MirroredStrategy in the test's process shares collective
instance keys with the strategies made there.

Usage: python -m tests.programs.clipped_mirrored CLIP|float16 OUT.npz"""

import sys

import numpy as np
import tensorflow as tf

tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                           [tf.config.LogicalDeviceConfiguration()] * 2)


def main(clip: str, out: str) -> None:
  import keras
  from tests.programs import custom_loop, sharded_resume
  x, y = custom_loop.data()
  half = clip == "float16"
  if half:
    keras.mixed_precision.set_dtype_policy("mixed_float16")
  with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
    model = sharded_resume.model_fn()  # The test's model, seeded, recompiled.
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9) if half else \
        keras.optimizers.Adam(0.01, global_clipnorm=float(clip))
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
  np.savez(out, *model.get_weights())


if __name__ == "__main__":
  main(*sys.argv[1:])
