"""Hybrid parallelism: data parallel across workers, each worker's model split over its own
devices.

A strategy cannot do this: MultiWorkerMirrored's variable creator mirrors every variable onto
each of its devices, so a split model would hold every weight, full size, on every device again.
So each worker builds its model outside the strategy's scope and splits it; the strategy is
only made to join the cluster (it sets up TensorFlow's collective ops between the tasks). Then,
as Horovod does, the gradients are averaged across workers with TensorFlow's collective ops
directly: each stage's gradients on that stage's device, among the same device of every worker
(one collective group per device index). The chief's initial weights are sent to every worker
first, and each worker trains on its slice of every global batch (as MultiWorkerMirrored splits
it), so training equals one device's on the global batch.

```yaml
cluster: {worker: 2}
strategy: multi_worker_mirrored
devices: {logical_cpus: 2}
parallel: {stages: balanced}
```
"""

from __future__ import annotations

import tensorflow as tf

# Collective keys of tfdist's own: tf.distribute's strategies number theirs from 1.
_GROUP_BASE, _GRADIENT_KEYS, _BROADCAST_KEYS, _SPARSE_KEYS = 7000, 70000, 170000, 270000


class Hybrid:
  """The cross-worker half of hybrid training, for worker `index` of `workers`."""

  def __init__(self, workers: int, index: int):
    self.workers, self.index = workers, index

  @classmethod
  def for_config(cls, config) -> "Hybrid":
    """This task's place among the cluster's chief and workers (TensorFlow's order)."""
    tasks = [("chief", 0)] * bool(config.cluster.chief) + \
        [("worker", i) for i in range(config.cluster.count("worker"))]
    task = config.task
    index = tasks.index((task.type, task.index)) if task is not None else 0
    return cls(len(tasks), index)

  def worker_slice(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Each global batch of `dataset` cut to this worker's contiguous slice."""
    workers, index = self.workers, self.index

    def cut(*element):
      element = element[0] if len(element) == 1 else element
      size = tf.shape(tf.nest.flatten(element)[0])[0]
      start, end = index * size // workers, (index + 1) * size // workers
      return tf.nest.map_structure(lambda t: t[start:end], element)
    return dataset.map(cut)

  def mean_gradients(self, gradients, variables):
    """The workers' mean of each gradient, reduced on its variable's device. A sparse one (an
    Embedding's rows) is gathered, every worker's rows in the workers' order, as one device
    looks them up in the global batch: Keras's update squares a repeated row's parts one by
    one, so their sum made dense would train elsewhere (0.043 off plain Keras, 2026-11-29)."""
    means = []
    for i, (g, v) in enumerate(zip(gradients, variables)):
      if g is None:
        means.append(None)
      elif isinstance(g, tf.IndexedSlices):
        means.append(self._gathered(g, v.value.device, _SPARSE_KEYS + 3 * i))
      else:
        means.append(self._all_reduce(g, v.value.device, _GRADIENT_KEYS + i) / self.workers)
    return means

  def _gathered(self, slices, device: str, instance_key: int) -> tf.IndexedSlices:
    """Every worker's rows of `slices`, each worker's count first (gathered), the rows padded
    to the largest count to be gathered, the padding dropped; divided by the workers."""
    with tf.device(device):
      count = tf.shape(slices.indices, out_type=tf.int32)[:1]
      counts = self._collective(tf.raw_ops.CollectiveGatherV2, count, device, instance_key)
      most = tf.reduce_max(counts)
      pad = [[0, most - count[0]]]
      values = tf.pad(slices.values, pad + [[0, 0]] * (slices.values.shape.rank - 1))
      values = self._collective(tf.raw_ops.CollectiveGatherV2, values, device, instance_key + 1)
      indices = self._collective(tf.raw_ops.CollectiveGatherV2, tf.pad(slices.indices, pad),
                                 device, instance_key + 2)
      kept = tf.reshape(tf.sequence_mask(counts, most), [-1])
      return tf.IndexedSlices(tf.boolean_mask(values, kept) / self.workers,
                              tf.boolean_mask(indices, kept), slices.dense_shape)

  def broadcast_weights(self, model) -> None:
    """Every worker's weights set to the chief's (worker 0), on their devices (eagerly)."""
    for i, variable in enumerate(model.weights):
      value = variable.value
      mine = value if self.index == 0 else tf.zeros_like(value)
      variable.assign(self._all_reduce(mine, value.device, _BROADCAST_KEYS + i))

  def _all_reduce(self, tensor, device: str, instance_key: int):
    return self._collective(tf.raw_ops.CollectiveReduceV2, tensor, device, instance_key,
                            merge_op="Add", final_op="Id")

  def _collective(self, op, tensor, device: str, instance_key: int, **kwargs):
    """`op` (a CollectiveV2 op) of `tensor` among the same device of every worker."""
    spec = tf.DeviceSpec.from_string(device)
    group = _GROUP_BASE + 100 * (spec.device_type == "GPU") + (spec.device_index or 0)
    with tf.device(device):
      return op(input=tensor, group_size=self.workers, group_key=group,
                instance_key=instance_key, ordering_token=[], **kwargs)
