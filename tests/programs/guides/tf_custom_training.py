"""TensorFlow's "Custom training with tf.distribute.Strategy" tutorial, the whole page, with no
tfdist in it: `MirroredStrategy()`, the datasets distributed with
`experimental_distribute_dataset`, the loss reduced by `compute_average_loss` and the
regularizers by `scale_regularization_loss`, metrics, model, optimizer and checkpoint made in
the scope, the `strategy.run` train and test steps, a checkpoint every other epoch; then the
checkpoint restored into a model without a strategy and evaluated, the loop written with an
iterator (`next` ten times an epoch), and the loop inside one `tf.function`. Small arrays stand
in for Fashion-MNIST (no download); the shuffle is seeded (the page's is not). Keras 3 spells
the page's `Reduction.NONE` "none" and `reset_states` `reset_state`.

Usage: python tf_custom_training.py WORKDIR. Prints `RESULT <section> <json>`.
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

WORKDIR = sys.argv[1]
tf.keras.utils.set_random_seed(0)


def report(section, value):
  print("RESULT", section, json.dumps(value), flush=True)


rng = np.random.default_rng(8)
train_images = rng.random((768, 8, 8, 1), dtype=np.float32)
train_labels = (train_images[:, :4].mean(axis=(1, 2, 3)) > 0.5).astype("int64")
test_images, test_labels = train_images[:128] * 0.9, train_labels[:128]

strategy = tf.distribute.MirroredStrategy()
print("Number of devices: {}".format(strategy.num_replicas_in_sync))

BUFFER_SIZE = len(train_images)
BATCH_SIZE_PER_REPLICA = 32
GLOBAL_BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync
EPOCHS = 3

train_dataset = tf.data.Dataset.from_tensor_slices(
    (train_images, train_labels)).shuffle(BUFFER_SIZE, seed=7).batch(GLOBAL_BATCH_SIZE)
test_dataset = tf.data.Dataset.from_tensor_slices(
    (test_images, test_labels)).batch(GLOBAL_BATCH_SIZE)
train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
test_dist_dataset = strategy.experimental_distribute_dataset(test_dataset)


def create_model():
  regularizer = tf.keras.regularizers.L2(1e-5)
  return tf.keras.Sequential([
      tf.keras.layers.Input(shape=(8, 8, 1)),
      tf.keras.layers.Conv2D(8, 3, activation="relu", kernel_regularizer=regularizer),
      tf.keras.layers.MaxPooling2D(),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(16, activation="relu", kernel_regularizer=regularizer),
      tf.keras.layers.Dense(2, kernel_regularizer=regularizer)])


checkpoint_dir = os.path.join(WORKDIR, "training_checkpoints")
checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt")

with strategy.scope():
  loss_object = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

  def compute_loss(labels, predictions, model_losses):
    per_example_loss = loss_object(labels, predictions)
    loss = tf.nn.compute_average_loss(per_example_loss)
    if model_losses:
      loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
    return loss

with strategy.scope():
  test_loss = tf.keras.metrics.Mean(name="test_loss")
  train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
  test_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="test_accuracy")

with strategy.scope():
  model = create_model()
  optimizer = tf.keras.optimizers.Adam(learning_rate=0.001)
  checkpoint = tf.train.Checkpoint(optimizer=optimizer, model=model)


def train_step(inputs):
  images, labels = inputs
  with tf.GradientTape() as tape:
    predictions = model(images, training=True)
    loss = compute_loss(labels, predictions, model.losses)
  gradients = tape.gradient(loss, model.trainable_variables)
  optimizer.apply_gradients(zip(gradients, model.trainable_variables))
  train_accuracy.update_state(labels, predictions)
  return loss


def test_step(inputs):
  images, labels = inputs
  predictions = model(images, training=False)
  t_loss = loss_object(labels, predictions)
  test_loss.update_state(t_loss)
  test_accuracy.update_state(labels, predictions)


@tf.function
def distributed_train_step(dataset_inputs):
  per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
  return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


@tf.function
def distributed_test_step(dataset_inputs):
  return strategy.run(test_step, args=(dataset_inputs,))


history = {"loss": [], "accuracy": [], "test_loss": [], "test_accuracy": []}
for epoch in range(EPOCHS):
  total_loss = 0.0
  num_batches = 0
  for x in train_dist_dataset:
    total_loss += distributed_train_step(x)
    num_batches += 1
  train_loss = total_loss / num_batches
  for x in test_dist_dataset:
    distributed_test_step(x)
  if epoch % 2 == 0:
    checkpoint.save(checkpoint_prefix)
  print("Epoch {}, Loss: {}, Accuracy: {}, Test Loss: {}, Test Accuracy: {}".format(
      epoch + 1, train_loss, train_accuracy.result() * 100, test_loss.result(),
      test_accuracy.result() * 100))
  for key, value in (("loss", train_loss), ("accuracy", train_accuracy.result()),
                     ("test_loss", test_loss.result()),
                     ("test_accuracy", test_accuracy.result())):
    history[key].append(float(value))
  test_loss.reset_state()
  train_accuracy.reset_state()
  test_accuracy.reset_state()
report("loop", history)
report("weights", [w.tolist() for w in model.get_weights()])

# Restore the latest checkpoint and test, without a strategy.
eval_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="eval_accuracy")
new_model = create_model()
new_optimizer = tf.keras.optimizers.Adam()
test_dataset = tf.data.Dataset.from_tensor_slices(
    (test_images, test_labels)).batch(GLOBAL_BATCH_SIZE)


@tf.function
def eval_step(images, labels):
  predictions = new_model(images, training=False)
  eval_accuracy(labels, predictions)


checkpoint = tf.train.Checkpoint(optimizer=new_optimizer, model=new_model)
checkpoint.restore(tf.train.latest_checkpoint(checkpoint_dir))
for images, labels in test_dataset:
  eval_step(images, labels)
print("Accuracy after restoring the saved model without strategy: {}".format(
    eval_accuracy.result() * 100))
report("restored", float(eval_accuracy.result()))

# Alternate ways of iterating over a dataset: an iterator.
losses = []
for _ in range(EPOCHS):
  total_loss = 0.0
  num_batches = 0
  train_iter = iter(train_dist_dataset)
  for _ in range(10):
    total_loss += distributed_train_step(next(train_iter))
    num_batches += 1
  average_train_loss = total_loss / num_batches
  print("Epoch {}, Loss: {}, Accuracy: {}".format(epoch + 1, average_train_loss,
                                                  train_accuracy.result() * 100))
  losses.append(float(average_train_loss))
  train_accuracy.reset_state()
report("iterator", losses)


# Iterating inside a tf.function.
@tf.function
def distributed_train_epoch(dataset):
  total_loss = 0.0
  num_batches = 0
  for x in dataset:
    per_replica_losses = strategy.run(train_step, args=(x,))
    total_loss += strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)
    num_batches += 1
  return total_loss / tf.cast(num_batches, dtype=tf.float32)


losses = []
for epoch in range(EPOCHS):
  train_loss = distributed_train_epoch(train_dist_dataset)
  print("Epoch {}, Loss: {}, Accuracy: {}".format(epoch + 1, train_loss,
                                                  train_accuracy.result() * 100))
  losses.append(float(train_loss))
  train_accuracy.reset_state()
report("in_function", losses)
report("final_weights", [w.tolist() for w in model.get_weights()])
