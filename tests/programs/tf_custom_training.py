"""TensorFlow's "Custom training with tf.distribute.Strategy" tutorial, twice: as it is written
(`tutorial`: MirroredStrategy by hand, `compute_average_loss`, `strategy.run` and
`strategy.reduce`, its own `tf.train.Checkpoint.save`), and ported to `tfdist.TrainingLoop` with
the lines docs/tutorials/custom-loop.md's diff changes (`ported`): everything else, the step's
signature `train_step(inputs)`, `return loss`, `total_loss / num_batches`, the test step, the
chief-only print of a metric and the checkpoint, as the tutorial has it. Small synthetic images
stand in for Fashion-MNIST (no download).

    python tf_custom_training.py tutorial|ported OUT_DIR

Prints `RESULT <json>` (per-epoch train loss, train and test accuracy, test loss, weights).
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

if sys.argv[1] == "ported":
  import tfdist

EPOCHS = 3
GLOBAL_BATCH_SIZE = 32
rng = np.random.default_rng(8)
train_images = rng.random((256, 8, 8, 1), dtype=np.float32)
train_labels = (train_images[:, :4].mean(axis=(1, 2, 3)) > 0.5).astype("int64")
test_images, test_labels = train_images[:64] * 0.9, train_labels[:64]
train_dataset = tf.data.Dataset.from_tensor_slices(
    (train_images, train_labels)).batch(GLOBAL_BATCH_SIZE)
test_dataset = tf.data.Dataset.from_tensor_slices(
    (test_images, test_labels)).batch(GLOBAL_BATCH_SIZE)


def create_model():
  init = tf.keras.initializers.GlorotUniform(seed=2)
  return tf.keras.Sequential([
      tf.keras.layers.InputLayer(shape=(8, 8, 1)),
      tf.keras.layers.Conv2D(8, 3, activation="relu", kernel_initializer=init),
      tf.keras.layers.MaxPooling2D(),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(16, activation="relu", kernel_initializer=init,
                            kernel_regularizer=tf.keras.regularizers.L2(1e-3)),
      tf.keras.layers.Dense(2, kernel_initializer=init)])


def report(history, model):
  print("RESULT " + json.dumps({**history,
                                "weights": [w.tolist() for w in model.get_weights()]}),
        flush=True)


def tutorial(out):
  """The tutorial as written (one device here: MirroredStrategy of this machine's one CPU)."""
  strategy = tf.distribute.MirroredStrategy()
  checkpoint_prefix = os.path.join(out, "training_checkpoints", "ckpt")
  with strategy.scope():
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE)

    def compute_loss(labels, predictions, model_losses):
      per_example_loss = loss_object(labels, predictions)
      loss = tf.nn.compute_average_loss(per_example_loss)
      if model_losses:
        loss += tf.nn.scale_regularization_loss(tf.add_n(model_losses))
      return loss
    test_loss = tf.keras.metrics.Mean(name="test_loss")
    train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
    test_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="test_accuracy")
    model = create_model()
    optimizer = tf.keras.optimizers.Adam(learning_rate=0.01)
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

  train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
  test_dist_dataset = strategy.experimental_distribute_dataset(test_dataset)
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
    print(f"Epoch {epoch + 1}, Loss: {float(train_loss)}, Accuracy: "
          f"{float(train_accuracy.result()) * 100}", flush=True)
    history["loss"].append(float(train_loss))
    history["accuracy"].append(float(train_accuracy.result()))
    history["test_loss"].append(float(test_loss.result()))
    history["test_accuracy"].append(float(test_accuracy.result()))
    test_loss.reset_state()
    train_accuracy.reset_state()
    test_accuracy.reset_state()
  report(history, model)


def ported(out):
  """The same, with the custom-loop page's diff applied."""
  loop = tfdist.TrainingLoop()                    # strategy from the YAML; tfdist launch
  checkpoint_prefix = os.path.join(out, "training_checkpoints", "ckpt")
  with loop.scope():
    loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=tf.keras.losses.Reduction.NONE)

    def compute_loss(labels, predictions, model_losses):
      per_example_loss = loss_object(labels, predictions)
      loss = tf.reduce_mean(per_example_loss)     # a mean over the step's batch
      if model_losses:
        loss += tf.add_n(model_losses)
      return loss
    test_loss = tf.keras.metrics.Mean(name="test_loss")
    train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
    test_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="test_accuracy")
    model = create_model()
    optimizer = tf.keras.optimizers.Adam(learning_rate=0.01)
    checkpoint = tf.train.Checkpoint(optimizer=optimizer, model=model)
  loop.prepare(model, optimizer, train_accuracy, test_loss, test_accuracy)

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

  history = {"loss": [], "accuracy": [], "test_loss": [], "test_accuracy": []}
  for epoch in loop.epochs(EPOCHS):
    total_loss = 0.0
    num_batches = 0
    for logs in loop.run(train_step, train_dataset):
      total_loss += logs["output"]
      num_batches += 1
    train_loss = total_loss / num_batches
    for _ in loop.run(test_step, test_dataset):
      pass
    if epoch % 2 == 0:
      checkpoint.save(checkpoint_prefix)
    if tfdist.is_chief():  # A metric read on the chief alone.
      print(f"Epoch {epoch + 1}, Loss: {float(train_loss)}, Accuracy: "
            f"{float(train_accuracy.result()) * 100}", flush=True)
    history["loss"].append(float(train_loss))
    history["accuracy"].append(float(train_accuracy.result()))
    history["test_loss"].append(float(test_loss.result()))
    history["test_accuracy"].append(float(test_accuracy.result()))
    test_loss.reset_state()
    train_accuracy.reset_state()
    test_accuracy.reset_state()
  report(history, model)


if __name__ == "__main__":
  tutorial(sys.argv[2]) if sys.argv[1] == "tutorial" else ported(sys.argv[2])
