"""TensorFlow's "Custom training with tf.distribute.Strategy" loop, ported to tfdist.TrainingLoop
as a user ports it: the step written as for one device (a Keras loss or `tf.reduce_mean` of the
per-example loss, `tape.gradient`, `optimizer.apply_gradients`, a Keras accuracy metric).

    python custom_loop.py OUT_DIR [keras_loss|reduce_mean] [EXIT_AFTER_EPOCH]

With PAUSE_AT=EPOCH:STEP, the chief of a first attempt prints PAUSED after that step of that
epoch (1-based) and waits until OUT_DIR/go exists: a test preempts it there. With
HANG_AT=EPOCH:STEP, worker-1 of a first attempt (no OUT_DIR/hung) blocks for good there; with
RAISE_AT=EPOCH:STEP it raises a RuntimeError there. With CHIEF_END_S=S, the chief works S
seconds more after training (a clean end its peers reach first).

Under the launcher's config; the chief writes OUT_DIR/result.npz (weights, per-epoch loss and
accuracy). With EXIT_AFTER_EPOCH=k, worker-1 of a first attempt (no OUT_DIR/crashed marker)
SIGKILLs itself after epoch k, so a test can check the restarted cluster resumes.
"""

import os
import signal
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import tfdist

EPOCHS = 4
COUNTED = {}  # The last train's loop.step and optimizer.iterations.


def data():
  rng = np.random.default_rng(0)
  x = rng.random((256, 16), dtype=np.float32)
  y = (x[:, :8].sum(axis=1) > x[:, 8:].sum(axis=1)).astype("int32")
  return x, y


def build():
  keras.utils.set_random_seed(3)
  return keras.Sequential([keras.Input((16,)),
                           keras.layers.Dense(32, activation="relu",
                                              kernel_regularizer=keras.regularizers.L2(1e-3)),
                           keras.layers.Dense(2)])


def user_step(model, optimizer, accuracy, style):
  """The user's step, written for one device."""
  loss_fn = keras.losses.SparseCategoricalCrossentropy(
      from_logits=True, reduction="none" if style == "reduce_mean" else "sum_over_batch_size")

  @tf.function  # A user's habit; the loop runs its Python function.
  def train_step(x, y):
    with tf.GradientTape() as tape:
      logits = model(x, training=True)
      loss = loss_fn(y, logits)
      if style == "reduce_mean":
        loss = tf.reduce_mean(loss)
      loss += tf.add_n(model.losses)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    accuracy.update_state(y, logits)
    return {"loss": loss}
  return train_step


def train(config=None, style="keras_loss", out=None, exit_after=None):
  """Returns (weights, [loss per epoch], [accuracy per epoch]) of the chief."""
  loop = tfdist.TrainingLoop(config)
  with loop.scope():
    model = build()
    optimizer = keras.optimizers.Adam(0.01)
    accuracy = keras.metrics.SparseCategoricalAccuracy()
  loop.prepare(model, optimizer, accuracy)
  train_step = user_step(model, optimizer, accuracy, style)
  x, y = data()
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(loop.global_batch_size)
  losses, accuracies = [], []
  for epoch in loop.epochs(EPOCHS):
    total_loss, num_batches = 0.0, 0  # As TensorFlow's custom-training tutorial counts.
    for logs in loop.run(train_step, dataset, steps=len(x) // loop.global_batch_size):
      total_loss, num_batches = total_loss + float(logs["loss"]), num_batches + 1
      _pause_if_asked(out, epoch + 1, num_batches)
      _kill_if_asked(out, epoch + 1, num_batches)
      _hang_if_asked(out, epoch + 1, num_batches)
      _raise_if_asked(epoch + 1, num_batches)
    losses.append(total_loss / num_batches)
    accuracies.append(float(accuracy.result()))
    accuracy.reset_state()
    loop.print(f"epoch {epoch + 1}: loss {losses[-1]:.4f} accuracy {accuracies[-1]:.4f}")
    if exit_after == epoch + 1 and out and not os.path.exists(os.path.join(out, "crashed")) \
        and tfdist.task() is not None and tfdist.task().index == 1:
      open(os.path.join(out, "crashed"), "w").close()
      os.kill(os.getpid(), signal.SIGKILL)  # As a dead machine would.
  COUNTED.update(steps=loop.step, iterations=int(optimizer.iterations.numpy()))
  return [w.numpy() for w in model.weights], losses, accuracies


def train_by_hand(style="keras_loss", steps_per_execution=1, accumulate=1):
  """The same training as a hand-written TensorFlow loop on one device, no tfdist: the
  reference. Returns what `train` returns: the weights, and per epoch the mean of every step's
  loss (`loop.run` yields each step's) and the accuracy; `steps_per_execution` changes nothing
  of it (kept for the callers' symmetry). With `accumulate`
  > 1 the optimizer is Keras's `gradient_accumulation_steps`."""
  model = build()
  optimizer = keras.optimizers.Adam(
      0.01, gradient_accumulation_steps=accumulate if accumulate > 1 else None)
  accuracy = keras.metrics.SparseCategoricalAccuracy()
  train_step = user_step(model, optimizer, accuracy, style)
  x, y = data()
  losses, accuracies = [], []
  for _ in range(EPOCHS):
    step_losses = [float(train_step(x[i:i + 32], y[i:i + 32])["loss"])
                   for i in range(0, len(x), 32)]
    losses.append(float(np.mean(step_losses)))
    accuracies.append(float(accuracy.result()))
    accuracy.reset_state()
  return [w.numpy() for w in model.weights], losses, accuracies


def local_sgd_by_hand(every, replicas=2, style="reduce_mean"):
  """Periodic averaging written out, no tfdist: `replicas` models, each with its own Adam,
  stepping by the user's step on its share of every global batch of 32 (replica i: rows
  i * 32 / replicas onwards), the weights (not the optimizer's state) averaged after every
  `every` steps and at the end. Returns the averaged weights."""
  models = [build() for _ in range(replicas)]
  optimizers = [keras.optimizers.Adam(0.01) for _ in models]
  steps = [user_step(m, o, keras.metrics.SparseCategoricalAccuracy(), style)
           for m, o in zip(models, optimizers)]
  x, y = data()
  share = 32 // replicas

  def average():
    for variables in zip(*(m.weights for m in models)):
      mean = np.mean([v.numpy() for v in variables], axis=0)
      for v in variables:
        v.assign(mean)
  done = 0
  for _ in range(EPOCHS):
    for first in range(0, len(x), 32):
      for i, step in enumerate(steps):
        rows = slice(first + i * share, first + (i + 1) * share)
        step(x[rows], y[rows])
      done += 1
      if done % every == 0:
        average()
  average()
  return [w.numpy() for w in models[0].weights]


def assert_one_devices_weights(result_path, steps_per_execution=2, atol=1e-5):
  """The chief's `result.npz` holds a hand-written one-device loop's weights (this loop,
  reduce_mean, global batch 32, float32): what a restarted, preempted or relaunched cluster
  must end with."""
  want, _, _ = train_by_hand("reduce_mean", steps_per_execution)
  result = np.load(result_path)
  assert len([k for k in result.files if k.startswith("w")]) == len(want)
  for i, w in enumerate(want):
    np.testing.assert_allclose(result[f"w{i}"], w, atol=atol)


def _raise_if_asked(epoch, call):
  if os.environ.get("RAISE_AT") == f"{epoch}:{call}" and tfdist.task() is not None and \
      tfdist.task().index == 1:
    raise RuntimeError("a bug in the user's loop")


def _hang_if_asked(out, epoch, call):
  if os.environ.get("HANG_AT") != f"{epoch}:{call}" or tfdist.task() is None or \
      tfdist.task().index != 1 or os.path.exists(os.path.join(out, "hung")):
    return
  open(os.path.join(out, "hung"), "w").close()
  block_forever()


def block_forever():
  """A deadlock in the user's own loop: the process lives, its heartbeat beats."""
  import threading
  threading.Event().wait()


def _kill_if_asked(out, epoch, call):
  """KILL_AT=EPOCH:CALL: worker-1 of a first attempt (no OUT_DIR/crashed) SIGKILLs itself after
  that call, mid-epoch."""
  if os.environ.get("KILL_AT") != f"{epoch}:{call}" or tfdist.task() is None or \
      tfdist.task().index != 1 or os.path.exists(os.path.join(out, "crashed")):
    return
  open(os.path.join(out, "crashed"), "w").close()
  os.kill(os.getpid(), signal.SIGKILL)  # As a dead machine would.


def _pause_if_asked(out, epoch, call):
  if os.environ.get("PAUSE_AT") != f"{epoch}:{call}" or not tfdist.is_chief() or \
      os.path.exists(os.path.join(out, "paused")):
    return
  open(os.path.join(out, "paused"), "w").close()
  print("PAUSED", flush=True)
  while not os.path.exists(os.path.join(out, "go")):
    time.sleep(0.05)


if __name__ == "__main__":
  out = sys.argv[1]
  os.makedirs(out, exist_ok=True)
  weights, losses, accuracies = train(style=sys.argv[2] if len(sys.argv) > 2 else "keras_loss",
                                      out=out,
                                      exit_after=int(sys.argv[3]) if len(sys.argv) > 3 else None)
  if tfdist.is_chief():
    time.sleep(float(os.environ.get("CHIEF_END_S", "0")))
    np.savez(os.path.join(out, "result.npz"), losses=losses, accuracies=accuracies, **COUNTED,
             **{f"w{i}": w for i, w in enumerate(weights)})
