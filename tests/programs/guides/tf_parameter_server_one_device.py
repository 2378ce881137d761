"""The "Training with Model.fit" section of TensorFlow's "Parameter server training" tutorial
(tests/programs/guides/tf_parameter_server.py) on one device, plain Keras, the reference of its
one-worker launch: the same seeded data, model, optimizer, loss, steps per call and steps,
without a strategy; the model is built on a batch first (plain Keras refuses BackupAndRestore
on an unbuilt model) and trains without callbacks (they write files, not numbers).
Prints `RESULT fit_loss <json>`."""

import json

import tensorflow as tf

tf.keras.utils.set_random_seed(0)
x = tf.random.uniform((10, 10), seed=1)
y = tf.random.uniform((10, 1), seed=2)
dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(10, seed=3).repeat()
dataset = dataset.batch(64).prefetch(2)
model = tf.keras.models.Sequential([tf.keras.layers.Dense(10)])
model.compile(tf.keras.optimizers.SGD(), loss="mse", steps_per_execution=10)
model.build((None, 10))
history = model.fit(dataset, epochs=5, steps_per_epoch=20, verbose=0)
print("RESULT fit_loss", json.dumps(history.history["loss"]), flush=True)
