"""The script of a parameter-server cluster's chief (and evaluator): tfdist.fit of a linear
regression on generated data; prints the history and the optimizer's update count as JSON.
With TRAIN_STEP=guide the model is a keras.Model with its own train_step, as Keras's guide
"Customizing what happens in fit()" writes one (its logs nest the compiled metrics). With
HANG_MARKER=PATH, that train_step of worker-1's first attempt (no marker yet) blocks for good
from update 60 on (`wait_forever`: a dequeue from a queue nobody fills). With PHASE_AUDIT=1,
`tests/programs/phase_audit.py` records the collectives it runs."""

import json
import os

import keras
import numpy as np
import tensorflow as tf

import tfdist
from tests.programs.user_models import GuidesOwnStep


def data(seed, count):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(count, 8)).astype("float32")
  y = x @ np.arange(1, 9, dtype="float32")[:, None] / 8 + 0.5
  return x, y


class GuideModel(GuidesOwnStep):
  """The guide's train_step, HANG_MARKER's block between the loss and the gradients; Keras's
  own test_step."""
  test_step = keras.Model.test_step

  def train_step(self, data):
    x, y = data
    with tf.GradientTape() as tape:
      y_pred = self(x, training=True)
      loss = self.compute_loss(y=y, y_pred=y_pred)
    if os.environ.get("HANG_MARKER"):
      wait_forever(self.optimizer.iterations, os.environ["HANG_MARKER"])
    gradients = tape.gradient(loss, self.trainable_variables)
    self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
    return self._updated(loss, y, y_pred)


def wait_forever(iterations, marker):
  """A step of worker-1 that never ends (an op waiting on what never comes), once: it leaves
  `marker`, so the restarted run goes on."""
  worker = tf.distribute.coordinator.experimental_get_current_worker_index()
  first = tf.equal(tf.size(tf.io.matching_files(marker)), 0)
  due = tf.logical_and(tf.logical_and(tf.equal(worker, 1), first), iterations >= 60)

  def block():
    with tf.control_dependencies([tf.io.write_file(marker, "")]):
      queue = tf.raw_ops.FIFOQueueV2(component_types=[tf.int32], capacity=1,
                                     shared_name="tfdist_test_never_filled")
      return tf.raw_ops.QueueDequeueV2(handle=queue, component_types=[tf.int32])[0]
  tf.cond(due, block, lambda: tf.constant(0))


def make_model():
  if os.environ.get("TRAIN_STEP") != "guide":
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
  inputs = keras.Input((8,))
  return GuideModel(inputs, keras.layers.Dense(1)(inputs))


def main():
  if os.environ.get("COORDINATOR_LOG"):  # The coordinator's recovery lines, with their times.
    record_coordinator(os.environ["COORDINATOR_LOG"])
  config = tfdist.load_config()
  x, y = data(0, 2048)
  history = tfdist.fit(make_model, x, y, config=config, validation_data=data(1, 256),
                       compile=lambda: dict(optimizer=keras.optimizers.SGD(0.05), loss="mse",
                                            metrics=["mae"]), verbose=2)
  model = history.model
  result = {"task": str(config.task), "history": history.history, "epochs": history.epoch,
            "iterations": int(model.optimizer.iterations.numpy())}
  if config.task.type == "chief":
    result["workers_running_steps"] = workers_running_steps(model.distribute_strategy)
    # A user's habit: Keras's own predict after fit (tfdist's coordinator loop runs it),
    # against the linear model's hand computation.
    kernel, bias = model.get_weights()
    predicted = model.predict(x[:40], verbose=0)
    result["keras_predict"] = float(np.abs(predicted - (x[:40] @ kernel + bias)).max())
    result["keras_predict_rows"] = len(predicted)
  print("RESULT " + json.dumps(result), flush=True)


def record_coordinator(path):
  """Appends TensorFlow's INFO lines (the ClusterCoordinator's failures and recoveries) to
  `path` with their times; the terminal keeps its WARNING level."""
  import logging

  logger = tf.get_logger()
  for handler in logger.handlers:
    handler.setLevel(max(handler.level, logger.getEffectiveLevel()))
  to_file = logging.FileHandler(path)
  to_file.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
  logger.addHandler(to_file)
  logger.setLevel(logging.INFO)


def workers_running_steps(strategy, seconds=60):
  """How many workers run scheduled functions within `seconds` (a restarted worker may still be
  starting when training ends): each worker's dataset holds the time it was made and a random
  number drawn there, so the distinct pairs the functions return count the workers that ran
  them (two workers making theirs in one microsecond do not count as one)."""
  import time

  coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)  # fit's, reused.
  made_at = iter(coordinator.create_per_worker_dataset(
      lambda: tf.data.Dataset.from_tensors(
          tf.stack([tf.timestamp(), tf.random.uniform([], maxval=2**40, dtype=tf.float64)]))
      .repeat()))
  probe = tf.function(lambda iterator: next(iterator))
  workers = len(tf.distribute.cluster_resolver.TFConfigClusterResolver().cluster_spec()
                .job_tasks("worker"))
  seen, deadline = set(), time.monotonic() + seconds
  while len(seen) < workers and time.monotonic() < deadline:
    calls = [coordinator.schedule(probe, args=(made_at,)) for _ in range(50)]
    coordinator.join()
    seen |= {tuple(call.fetch().tolist()) for call in calls}
  tf.get_logger().info("probe: %d workers ran scheduled functions", len(seen))
  return len(seen)


if __name__ == "__main__":
  if os.environ.get("PHASE_AUDIT"):  # Prints `MARKED <collective>` as each is entered.
    from tests.programs import phase_audit
    phase_audit.audit()
  main()
