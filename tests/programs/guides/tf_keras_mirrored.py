"""TensorFlow's "Distributed training with Keras" tutorial, the whole page, with no tfdist in
it: `MirroredStrategy()`, the global batch from its replica count, the CNN built and compiled
in its scope, the callbacks (TensorBoard, ModelCheckpoint of the weights each epoch, a
LearningRateScheduler, the page's PrintLR), `fit`, the latest checkpoint loaded and evaluated,
the model saved, loaded without a strategy (compiled again, evaluated) and loaded in the
strategy's scope (compiled, evaluated), and exported as a SavedModel. Scikit-learn's digits
stand in for MNIST (no download); the shuffle is seeded (the page's is not).

Usage: python tf_keras_mirrored.py WORKDIR. Prints `RESULT <section> <json>`.
"""

import json
import os
import pathlib
import sys

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

WORKDIR = sys.argv[1]
tf.keras.utils.set_random_seed(0)


def report(section, value):
  print("RESULT", section, json.dumps(value), flush=True)


x, y = load_digits(return_X_y=True)
x = (x / 16.0).reshape(-1, 8, 8, 1).astype("float32")
mnist_train = tf.data.Dataset.from_tensor_slices((x[:1536], y[:1536].astype("int64")))
mnist_test = tf.data.Dataset.from_tensor_slices((x[1536:], y[1536:].astype("int64")))

strategy = tf.distribute.MirroredStrategy()
print("Number of devices: {}".format(strategy.num_replicas_in_sync))

BUFFER_SIZE = 1536
BATCH_SIZE_PER_REPLICA = 32
BATCH_SIZE = BATCH_SIZE_PER_REPLICA * strategy.num_replicas_in_sync


def scale(image, label):
  return tf.cast(image, tf.float32), label


train_dataset = mnist_train.map(scale).cache().shuffle(BUFFER_SIZE, seed=7).batch(BATCH_SIZE)
eval_dataset = mnist_test.map(scale).batch(BATCH_SIZE)

with strategy.scope():
  model = tf.keras.Sequential([
      tf.keras.layers.Input(shape=(8, 8, 1)),
      tf.keras.layers.Conv2D(8, 3, activation="relu"),
      tf.keras.layers.MaxPooling2D(),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(32, activation="relu"),
      tf.keras.layers.Dense(10)])
  model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                optimizer=tf.keras.optimizers.Adam(learning_rate=0.001),
                metrics=["accuracy"])

checkpoint_dir = os.path.join(WORKDIR, "training_checkpoints")
checkpoint_prefix = os.path.join(checkpoint_dir, "ckpt_{epoch:04d}.weights.h5")


def decay(epoch):
  if epoch < 3:
    return 1e-3
  elif epoch >= 3 and epoch < 7:
    return 1e-4
  else:
    return 1e-5


class PrintLR(tf.keras.callbacks.Callback):
  def on_epoch_end(self, epoch, logs=None):
    print("\nLearning rate for epoch {} is {}".format(
        epoch + 1, model.optimizer.learning_rate.numpy()))


callbacks = [
    tf.keras.callbacks.TensorBoard(log_dir=os.path.join(WORKDIR, "logs")),
    tf.keras.callbacks.ModelCheckpoint(filepath=checkpoint_prefix, save_weights_only=True),
    tf.keras.callbacks.LearningRateScheduler(decay),
    PrintLR()]

EPOCHS = 5
report("fit", model.fit(train_dataset, epochs=EPOCHS, callbacks=callbacks, verbose=0).history)
report("checkpoints", sorted(p.name for p in pathlib.Path(checkpoint_dir).glob("*")))

latest_checkpoint = sorted(pathlib.Path(checkpoint_dir).glob("*"))[-1]
model.load_weights(latest_checkpoint)
eval_loss, eval_acc = model.evaluate(eval_dataset, verbose=0)
print("Eval loss: {}, Eval accuracy: {}".format(eval_loss, eval_acc))
report("evaluate", [eval_loss, eval_acc])
report("logs", sorted(p.name for p in pathlib.Path(WORKDIR, "logs").iterdir()))

path = os.path.join(WORKDIR, "my_model.keras")
model.save(path)

unreplicated_model = tf.keras.models.load_model(path)
unreplicated_model.compile(
    loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    optimizer=tf.keras.optimizers.Adam(), metrics=["accuracy"])
eval_loss, eval_acc = unreplicated_model.evaluate(eval_dataset, verbose=0)
print("Eval loss: {}, Eval Accuracy: {}".format(eval_loss, eval_acc))
report("unreplicated", [eval_loss, eval_acc])

with strategy.scope():
  replicated_model = tf.keras.models.load_model(path)
  replicated_model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                           optimizer=tf.keras.optimizers.Adam(), metrics=["accuracy"])
  eval_loss, eval_acc = replicated_model.evaluate(eval_dataset, verbose=0)
  print("Eval loss: {}, Eval Accuracy: {}".format(eval_loss, eval_acc))
report("replicated", [eval_loss, eval_acc])

# Export to SavedModel (the page's last section): served by TF Serving; its function predicts
# what the model does.
model.export(os.path.join(WORKDIR, "saved_model"))
serving = tf.saved_model.load(os.path.join(WORKDIR, "saved_model"))
images = next(iter(eval_dataset))[0]
report("exported", float(np.abs(serving.serve(images).numpy() - model.predict(
    images, verbose=0)).max()))
report("weights", [w.tolist() for w in model.get_weights()])
