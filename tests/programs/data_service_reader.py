"""A training script's input sent through the launch's tf.data service as TensorFlow's guide
teaches (`distribute("distributed_epoch", service)`), the service's address from tfdist: reads
EPOCHS epochs of ROWS elements (each map a few ms of matrix products, so an epoch lasts
seconds) and prints `EPOCH e <json counts>` (element -> times seen), `MIDWAY` once 100 elements
of epoch 1 were read (a test kills a data worker then)."""

import collections
import json

import tensorflow as tf

import tfdist

ROWS, EPOCHS = 400, 3


def slow(i):
  m = tf.random.stateless_normal((200, 200), seed=[1, 2])
  for _ in range(10):
    m = tf.linalg.matmul(m, m) / 200.0
  return i + tf.cast(tf.reduce_sum(m) * 0, tf.int64)


served = tf.data.Dataset.range(ROWS).map(slow).apply(tf.data.experimental.service.distribute(
    "distributed_epoch", tfdist.data_service_address()))
for epoch in range(EPOCHS):
  seen = collections.Counter()
  for i, element in enumerate(served.as_numpy_iterator()):
    seen[int(element)] += 1
    if epoch == 1 and i == 100:
      print("MIDWAY", flush=True)
  print(f"EPOCH {epoch} {json.dumps(seen)}", flush=True)
