"""tfdist's reduce-scatter against TensorFlow's ring all-reduce, sliced, on N logical CPUs (or
this task's replicas of a launched multi_worker_mirrored cluster): random float32 tensors of
several lengths, values over six orders of magnitude (where the order of a sum shows).

Prints `SIZE n BITWISE True|False MAX_DIFF x` per length, and `SHARD n s` (the shard's
elements).

Usage: python -m tests.programs.reduce_scatter_check N"""

import sys

import numpy as np


def main(replicas: str) -> None:
  import tfdist
  import tensorflow as tf
  from tfdist.training import reduce_scatter as rs
  config = tfdist.load_config() if tfdist.task() else tfdist.load_config(
      {"strategy": "mirrored", "devices": {"logical_cpus": int(replicas)}})
  strategy = tfdist.make_strategy(config)
  n = strategy.num_replicas_in_sync
  launchers = rs.replica_launchers(strategy)
  ring = tf.distribute.experimental.CommunicationOptions(
      implementation=tf.distribute.experimental.CommunicationImplementation.RING)
  ids = strategy.experimental_local_results(strategy.experimental_distribute_values_from_function(
      lambda context: context.replica_id_in_sync_group))
  for length in (1, 17, 3000, 100_003):
    size = rs.shard_size(length, n)
    rng = np.random.default_rng(length)
    values = [(rng.normal(size=length) * 10.0 ** rng.uniform(-3, 3, size=length))
              .astype("float32") for _ in range(n)]

    @tf.function
    def both():
      pairs = []
      for device, rank in zip(strategy.extended.worker_devices, ids):
        launcher = launchers[tf.DeviceSpec.from_string(device).to_string()]
        with tf.device(device):
          value = tf.constant(values[int(rank)])
          shard = rs.reduce_scatter(launcher, tf.pad(value, [[0, n * size - length]]),
                                    int(rank), n)
          whole = tf.pad(launcher.all_reduce(value, options=ring), [[0, n * size - length]])
          pairs.append((shard, whole[int(rank) * size:(int(rank) + 1) * size]))
      return pairs
    pairs = [(a.numpy(), b.numpy()) for a, b in both()]
    bitwise = all(np.array_equal(a, b) for a, b in pairs)
    diff = max(float(np.abs(a - b).max()) for a, b in pairs)
    print(f"SIZE {length} BITWISE {bitwise} MAX_DIFF {diff}", flush=True)
    print(f"SHARD {length} {size}", flush=True)


if __name__ == "__main__":
  main(*sys.argv[1:])
