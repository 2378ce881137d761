"""TensorFlow's "Custom training loop with Keras and MultiWorkerMirroredStrategy" tutorial, the
whole `main.py` as one worker's program, with no tfdist in it: the dataset function sharding
and batching per input pipeline, the CNN with L2 regularizers built in the strategy's scope,
RMSprop and an accuracy metric, the `tf.function` step with `strategy.run`,
`compute_average_loss` and `scale_regularization_loss`, the page's checkpoint of the model and
its epoch counters written through `write_filepath` (the chief's kept, the others' removed),
restored from the latest checkpoint, and the epoch loop. Scikit-learn's digits stand in for
MNIST (no download); the shuffle is seeded (the page's is not: each worker's order would be
its own). Keras 3 spells the page's `Reduction.NONE` "none" and `reset_states` `reset_state`.

Usage: python tf_multi_worker_ctl.py WORKDIR. Prints `RESULT <section> <json>`.
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

WORKDIR = sys.argv[1]
tf.keras.utils.set_random_seed(0)


def report(section, value):
  print("RESULT", section, json.dumps(value), flush=True)


# mnist.py
def mnist_dataset(batch_size):
  x_train, y_train = load_digits(return_X_y=True)
  x_train = (x_train / np.float32(16)).reshape(-1, 8, 8).astype("float32")
  y_train = y_train.astype(np.int64)
  return tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(1797, seed=7)


def dataset_fn(global_batch_size, input_context):
  batch_size = input_context.get_per_replica_batch_size(global_batch_size)
  dataset = mnist_dataset(batch_size)
  dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
  dataset = dataset.batch(batch_size)
  return dataset


def build_cnn_model():
  regularizer = tf.keras.regularizers.L2(1e-5)
  return tf.keras.Sequential([
      tf.keras.Input(shape=(8, 8)),
      tf.keras.layers.Reshape(target_shape=(8, 8, 1)),
      tf.keras.layers.Conv2D(8, 3, activation="relu", kernel_regularizer=regularizer),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(32, activation="relu", kernel_regularizer=regularizer),
      tf.keras.layers.Dense(10, kernel_regularizer=regularizer)])


# main.py
per_worker_batch_size = 32
tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])
global_batch_size = per_worker_batch_size * num_workers

num_epochs = 3
num_steps_per_epoch = 10


def _is_chief(task_type, task_id, cluster_spec):
  return (task_type is None or task_type == "chief" or
          (task_type == "worker" and task_id == 0 and "chief" not in cluster_spec.as_dict()))


def _get_temp_dir(dirpath, task_id):
  temp_dir = os.path.join(dirpath, "workertemp_" + str(task_id))
  tf.io.gfile.makedirs(temp_dir)
  return temp_dir


def write_filepath(filepath, task_type, task_id, cluster_spec):
  dirpath = os.path.dirname(filepath)
  base = os.path.basename(filepath)
  if not _is_chief(task_type, task_id, cluster_spec):
    dirpath = _get_temp_dir(dirpath, task_id)
  return os.path.join(dirpath, base)


checkpoint_dir = os.path.join(WORKDIR, "ckpt")

strategy = tf.distribute.MultiWorkerMirroredStrategy()

with strategy.scope():
  multi_worker_model = build_cnn_model()
  multi_worker_dataset = strategy.distribute_datasets_from_function(
      lambda input_context: dataset_fn(global_batch_size, input_context))
  optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.001)
  train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")


@tf.function
def train_step(iterator):
  """Training step function."""

  def step_fn(inputs):
    x, y = inputs
    with tf.GradientTape() as tape:
      predictions = multi_worker_model(x, training=True)
      per_example_loss = tf.keras.losses.SparseCategoricalCrossentropy(
          from_logits=True, reduction="none")(y, predictions)
      loss = tf.nn.compute_average_loss(per_example_loss)
      model_losses = multi_worker_model.losses
      if model_losses:
        loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
    grads = tape.gradient(loss, multi_worker_model.trainable_variables)
    optimizer.apply_gradients(zip(grads, multi_worker_model.trainable_variables))
    train_accuracy.update_state(y, predictions)
    return loss

  per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
  return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


epoch = tf.Variable(initial_value=tf.constant(0, dtype=tf.dtypes.int64), name="epoch")
step_in_epoch = tf.Variable(initial_value=tf.constant(0, dtype=tf.dtypes.int64),
                            name="step_in_epoch")
task_type, task_id, cluster_spec = (strategy.cluster_resolver.task_type,
                                    strategy.cluster_resolver.task_id,
                                    strategy.cluster_resolver.cluster_spec())
checkpoint = tf.train.Checkpoint(model=multi_worker_model, epoch=epoch,
                                 step_in_epoch=step_in_epoch)
write_checkpoint_dir = write_filepath(checkpoint_dir, task_type, task_id, cluster_spec)
checkpoint_manager = tf.train.CheckpointManager(checkpoint, directory=write_checkpoint_dir,
                                                max_to_keep=1)

# Restoring the checkpoint.
latest_checkpoint = tf.train.latest_checkpoint(checkpoint_dir)
if latest_checkpoint:
  checkpoint.restore(latest_checkpoint)

# Resume the custom training loop.
losses, accuracies = [], []
while epoch.numpy() < num_epochs:
  iterator = iter(multi_worker_dataset)
  total_loss = 0.0
  num_batches = 0
  while step_in_epoch.numpy() < num_steps_per_epoch:
    total_loss += train_step(iterator)
    num_batches += 1
    step_in_epoch.assign_add(1)
  train_loss = total_loss / num_batches
  print("Epoch: %d, accuracy: %f, train_loss: %f."
        % (epoch.numpy(), train_accuracy.result(), train_loss))
  losses.append(float(train_loss))
  accuracies.append(float(train_accuracy.result()))
  train_accuracy.reset_state()
  checkpoint_manager.save()
  if not _is_chief(task_type, task_id, cluster_spec):
    tf.io.gfile.rmtree(write_checkpoint_dir)
  epoch.assign_add(1)
  step_in_epoch.assign(0)
report("loop", {"loss": losses, "accuracy": accuracies})
report("weights", [w.tolist() for w in multi_worker_model.get_weights()])
report("saved", sorted(os.listdir(checkpoint_dir)))
