"""An exact reduce-scatter on CPUs from the collectives TensorFlow has: replica r gets its shard of
the sum over the replicas, without anyone holding the whole sum.

TensorFlow 2.21 registers `CollectiveReduceScatterV2` for NCCL only (on CPU the param resolver
finds no implementation: tests/test_sharded_optimizer.py keeps the detector). Its CPU
`AllToAll` works once each op carries an ordering token (without one every member waits out
its timeout: measured here, and how TensorFlow's own collective_ops_test calls it). So each
replica cuts its tensor into N chunks, all-to-all sends chunk k to replica k, and each sums the
N chunks it receives in the order TensorFlow's ring all-reduce sums that chunk: chunk r starts
on replica r, then r + 1, ... (ring_alg.cc, one subdivision), in a loop (a chain of adds is
reordered by Grappler's arithmetic optimizer), each chunk the ring's size (`shard_size`). The
shard is then bit for bit the slice of that all-reduce of the unpadded tensor
(tests/test_reduce_scatter.py); a
ring that subdivides (chunks over 4 MiB) sums in another order, the same sum rounded
differently. Traffic per replica: (N-1)/N of the tensor, half an all-reduce's.

```python
launchers = replica_launchers(strategy)       # one per local replica, with its rank
shard = reduce_scatter(launchers[device], flat_gradients, rank, replicas)
```
"""

from __future__ import annotations

import tensorflow as tf

RING_ALIGN_BYTES = 64
"""TensorFlow's CPU ring aligns each chunk to Eigen's 64 bytes (EIGEN_MAX_ALIGN_BYTES of its
build): measured, and checked against its all-reduce by tests/test_reduce_scatter.py."""

_TIMEOUT = 600.0  # Seconds: a member that never comes raises DeadlineExceeded, not a hang.
_OWN: dict = {}  # Launchers made here, by devices: one group key each, made once a process.


def shard_size(elements: int, replicas: int, itemsize: int = 4) -> int:
  """Elements of each replica's shard: the chunk TensorFlow's ring all-reduce cuts from
  `elements` over `replicas` (CollectiveAdapter's `AlignedChunkElts`: ceil(elements / replicas)
  taken past the next 64-byte boundary, a whole 64 bytes more when it is on one).

  ```python
  shard_size(3000, 3)   # 1008: 1000 float32 are 4000 bytes, 4032 the next boundary
  shard_size(3024, 3)   # 1024: 1008 float32 end on a boundary: one more 64 bytes
  ```
  """
  chunk = -(-elements // replicas)
  if RING_ALIGN_BYTES <= itemsize:
    return chunk
  size = chunk * itemsize
  return chunk + (RING_ALIGN_BYTES - size % RING_ALIGN_BYTES) // itemsize


def replica_launchers(strategy) -> dict:
  """{device: TensorFlow's `CollectiveReplicaLauncher`} of this process's replicas: the
  strategy's own under collective all-reduce (multi_worker_mirrored), else launchers of a
  group of this process's devices made once (mirrored's default reduces on one device)."""
  from tensorflow.python.distribute import cross_device_ops, cross_device_utils
  ops = strategy.extended._cross_device_ops  # pylint: disable=protected-access
  if not isinstance(ops, cross_device_ops.CollectiveAllReduce):
    devices = tuple(strategy.extended.worker_devices)
    if devices not in _OWN:  # A group key of its own: collectives of one key must agree.
      keys = cross_device_utils.CollectiveKeys(group_key_start=10_000 + 100 * len(_OWN))
      _OWN[devices] = cross_device_ops.CollectiveAllReduce(
          devices=list(devices), group_size=len(devices), collective_keys=keys,
          options=tf.distribute.experimental.CommunicationOptions())
    ops = _OWN[devices]
  return {tf.DeviceSpec.from_string(l._device).to_string(): l  # pylint: disable=protected-access
          for l in ops._launchers}  # pylint: disable=protected-access


def reduce_scatter(launcher, flat: tf.Tensor, rank: int, replicas: int) -> tf.Tensor:
  """Replica `rank`'s shard of the sum of `flat` over the replicas. Every replica calls it, in
  the same order, with a 1-D tensor of the same length: `replicas * shard_size(...)`.

  Args:
    launcher: this replica's launcher (`replica_launchers`).
    flat: this replica's tensor, 1-D, `replicas` shards long (padded by the caller).
    rank: this replica's rank in the group (its replica id in sync).
    replicas: the group's size.

  Returns:
    The summed shard `rank`: `flat` summed over the replicas, elements
    `[rank * n / replicas, (rank + 1) * n / replicas)`.
  """
  # pylint: disable=protected-access
  from tensorflow.python.ops import collective_ops
  if replicas == 1:
    return flat
  chunks = tf.reshape(flat, [replicas, -1])
  with tf.device(launcher._device):
    received = collective_ops.all_to_all_v2(
        chunks, replicas, launcher._group_key, launcher._next_instance_key(),
        ordering_token=launcher._get_ordering_token(), timeout=_TIMEOUT)
    # The ring's order for this chunk: from this rank on. A loop, not a chain of adds:
    # Grappler's arithmetic optimizer rewrites a chain into one AddN of its own order.
    # Each chunk read in the loop (no reordered copy of them all outlives the sum).
    return tf.foldl(lambda total, k: total + tf.gather(received, (rank + k) % replicas),
                    tf.range(1, replicas), initializer=received[rank], parallel_iterations=1)
