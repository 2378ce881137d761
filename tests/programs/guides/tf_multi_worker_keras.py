"""TensorFlow's "Multi-worker training with Keras" tutorial, the whole page as one worker's
program, with no tfdist in it: the dataset and CNN of its `mnist_setup.py` (scikit-learn's
digits for MNIST, which needs the network; a seeded shuffle), its `main.py` (the
`MultiWorkerMirroredStrategy`, the global batch from TF_CONFIG's workers, `model.fit`), then
the "in depth" sections in order: a dataset with auto-sharding off, `model.save` by every
worker through the page's `write_filepath` and `load_model` of the chief's file on every
worker, training the loaded model, a `tf.train.CheckpointManager` saved and restored the
same way, and `BackupAndRestore` at epoch ends and every 30 steps.

Usage: python tf_multi_worker_keras.py WORKDIR. Prints `RESULT <section> <json>`
as each section ends.
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

WORKDIR = sys.argv[1]
tf.keras.utils.set_random_seed(0)  # A user's seed: initial weights as on one device.


def report(section, value):
  print("RESULT", section, json.dumps(value), flush=True)


def weights(model):
  return [w.tolist() for w in model.get_weights()]


# mnist_setup.py
def mnist_dataset(batch_size):
  x_train, y_train = load_digits(return_X_y=True)
  x_train = (x_train / np.float32(16)).reshape(-1, 8, 8).astype("float32")
  y_train = y_train.astype(np.int64)
  return tf.data.Dataset.from_tensor_slices(
      (x_train, y_train)).shuffle(1797, seed=7).repeat().batch(batch_size)


def build_and_compile_cnn_model():
  model = tf.keras.Sequential([
      tf.keras.layers.InputLayer(shape=(8, 8)),
      tf.keras.layers.Reshape(target_shape=(8, 8, 1)),
      tf.keras.layers.Conv2D(8, 3, activation="relu"),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(32, activation="relu"),
      tf.keras.layers.Dense(10)])
  model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                optimizer=tf.keras.optimizers.SGD(learning_rate=0.05),
                metrics=["accuracy"])
  return model


# main.py
per_worker_batch_size = 32
tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])
strategy = tf.distribute.MultiWorkerMirroredStrategy()
global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_dataset(global_batch_size)
with strategy.scope():
  multi_worker_model = build_and_compile_cnn_model()
report("replicas", strategy.num_replicas_in_sync)
report("fit", multi_worker_model.fit(multi_worker_dataset, epochs=3, steps_per_epoch=14,
                                     verbose=0).history)

# Dataset sharding.
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
dataset_no_auto_shard = mnist_dataset(batch_size=64).with_options(options)

# Model saving and loading.
model_path = os.path.join(WORKDIR, "keras-model.keras")


def _is_chief(task_type, task_id):
  return (task_type == "worker" and task_id == 0) or task_type is None


def _get_temp_dir(dirpath, task_id):
  temp_dir = os.path.join(dirpath, "workertemp_" + str(task_id))
  tf.io.gfile.makedirs(temp_dir)
  return temp_dir


def write_filepath(filepath, task_type, task_id):
  dirpath = os.path.dirname(filepath)
  base = os.path.basename(filepath)
  if not _is_chief(task_type, task_id):
    dirpath = _get_temp_dir(dirpath, task_id)
  return os.path.join(dirpath, base)


task_type, task_id = (strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id)
write_model_path = write_filepath(model_path, task_type, task_id)
multi_worker_model.save(write_model_path)
if not _is_chief(task_type, task_id):
  tf.io.gfile.rmtree(os.path.dirname(write_model_path))
loaded_model = tf.keras.models.load_model(model_path)
report("loaded", weights(loaded_model))
single_worker_dataset = mnist_dataset(64)
report("loaded_fit", loaded_model.fit(single_worker_dataset, epochs=2, steps_per_epoch=5,
                                     verbose=0).history)

# Checkpoint saving and restoring.
checkpoint_dir = os.path.join(WORKDIR, "ckpt")
checkpoint = tf.train.Checkpoint(model=multi_worker_model)
write_checkpoint_dir = write_filepath(checkpoint_dir, task_type, task_id)
checkpoint_manager = tf.train.CheckpointManager(
    checkpoint, directory=write_checkpoint_dir, max_to_keep=1)
checkpoint_manager.save()
if not _is_chief(task_type, task_id):
  tf.io.gfile.rmtree(write_checkpoint_dir)
latest_checkpoint = tf.train.latest_checkpoint(checkpoint_dir)
checkpoint.restore(latest_checkpoint)
report("restored_fit", multi_worker_model.fit(multi_worker_dataset, epochs=2,
                                             steps_per_epoch=5, verbose=0).history)

# The BackupAndRestore callback: at epoch ends (by default, then said), then every 30 steps.
for name, save_freq in (("backup", None), ("backup_epoch", "epoch"), ("backup_30", 30)):
  kwargs = {} if save_freq is None else {"save_freq": save_freq}
  callbacks = [tf.keras.callbacks.BackupAndRestore(
      backup_dir=os.path.join(WORKDIR, "backup"), **kwargs)]
  with strategy.scope():
    multi_worker_model = build_and_compile_cnn_model()
  report(name, multi_worker_model.fit(multi_worker_dataset, epochs=3, steps_per_epoch=14,
                                      callbacks=callbacks, verbose=0).history)
  report(name + "_weights", weights(multi_worker_model))
