"""A task of a multi-worker cluster: makes the strategy from the environment (TF_CONFIG and
TFDIST_CONFIG, as `tfdist launch` sets them) and all-reduces its task index + 1."""

import tensorflow as tf

import tfdist

config = tfdist.load_config()
strategy = tfdist.make_strategy(config)


@tf.function
def contribution():
  context = tf.distribute.get_replica_context()
  return context.all_reduce("sum", tf.constant(float(config.task.index + 1)))


total = strategy.reduce("mean", strategy.run(contribution), axis=None)
print(f"replicas={strategy.num_replicas_in_sync} sum={total.numpy()}", flush=True)
