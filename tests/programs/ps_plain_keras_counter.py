"""Detector of keras-team/keras#21054 under parameter-server training: Keras's own train_step
scheduled on two workers, without tfdist's fix; prints how many updates
`optimizer.iterations` counted of the scheduled steps."""

import numpy as np
import tensorflow as tf

import keras
import tfdist
from keras.src.backend.tensorflow import core

# Keras's own assign_add, as without the launcher (tfdist.launched.parameter_servers makes a
# ps variable's add atomic in a launched task).
core.Variable.assign_add = getattr(core.Variable.assign_add, "__wrapped__",
                                   core.Variable.assign_add)

STEPS = 1000  # Enough that both workers interleave an update, even on a loaded machine.

strategy = tfdist.make_strategy()
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
x = np.random.default_rng(0).normal(size=(256, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)
with strategy.scope():
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
  model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
  model._symbolic_build(data_batch=(x[:16], y[:16]))
iterator = iter(coordinator.create_per_worker_dataset(
    lambda: tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)))


@tf.function
def train(iterator):
  return strategy.run(model.train_step, args=(next(iterator),))


for _ in range(STEPS):
  coordinator.schedule(train, args=(iterator,))
coordinator.join()
print(f"COUNTED {int(model.optimizer.iterations.numpy())} OF {STEPS}", flush=True)
