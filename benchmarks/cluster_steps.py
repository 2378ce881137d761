"""One task of a benchmark cluster (started by `tfdist launch`): trains the benchmark MLP and,
on the chief (worker 0 without one), prints its steps/s as `STEPS_PER_SECOND x`.

  python -m benchmarks.cluster_steps tfdist|by_hand
"""

import os
import statistics
import sys
import time

import tfdist
from benchmarks import common

BATCH, STEPS, EPOCHS = 256, 40, 4


def with_tfdist(config, x, y):
  timer = common.EpochTimer()
  tfdist.fit(common.model_fn, x, y, config=config, compile=common.compile_args,
             callbacks=[timer], verbose=0)
  return config.training.steps_per_epoch / statistics.median(timer.seconds)


def by_hand(config, x, y):
  """TensorFlow's parameter-server guide, with a Keras 3 model: a ClusterCoordinator schedules
  a GradientTape step per call on per-worker datasets, updating the loss and accuracy metrics
  as tfdist's Keras train_step does (the guide's `accuracy.update_state` in the step)."""
  import keras
  import tensorflow as tf

  strategy = tf.distribute.experimental.ParameterServerStrategy(
      tf.distribute.cluster_resolver.TFConfigClusterResolver())
  coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
  with strategy.scope():
    model = common.model_fn()
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    mean_loss = keras.metrics.Mean()
    accuracy = keras.metrics.SparseCategoricalAccuracy()
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  per_worker = coordinator.create_per_worker_dataset(
      lambda: tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x)).repeat()
      .batch(BATCH, drop_remainder=True).prefetch(tf.data.AUTOTUNE))
  iterator = iter(per_worker)

  @tf.function
  def step(iterator):
    def replica(features, labels):
      with tf.GradientTape() as tape:
        logits = model(features, training=True)
        loss = loss_fn(labels, logits)
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      mean_loss.update_state(loss)
      accuracy.update_state(labels, logits)
      return loss
    return strategy.run(replica, args=next(iterator))

  seconds = []
  for epoch in range(EPOCHS):
    start = time.perf_counter()
    for _ in range(STEPS):
      coordinator.schedule(step, args=(iterator,))
    coordinator.join()
    if epoch:
      seconds.append(time.perf_counter() - start)
  return STEPS / statistics.median(seconds)


def main():
  config = tfdist.load_config()
  x, y = common.data(8192)
  steps = {"tfdist": with_tfdist, "by_hand": by_hand}[sys.argv[1]](config, x, y)
  task = config.task
  if task.type == "chief" or (task.type == "worker" and task.index == 0 and
                              not config.cluster.chief):
    print(f"STEPS_PER_SECOND {steps}", flush=True)
  os._exit(0)  # Skip TensorFlow's slow teardown of the cluster's channels.


if __name__ == "__main__":
  main()
