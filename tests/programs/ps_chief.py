"""The chief of a parameter-server cluster: schedules a function on the workers that reads a
variable living on the ps."""

import tensorflow as tf

import tfdist

strategy = tfdist.make_strategy()
coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
  variable = tf.Variable(1.0)


@tf.function
def add_41():
  return variable + 41.0


results = [coordinator.schedule(add_41) for _ in range(4)]
coordinator.join()
print(f"variable_device={variable.device} results={[float(r.fetch()) for r in results]}", flush=True)
