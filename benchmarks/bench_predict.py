"""Bulk prediction: Keras's `predict`, a hand-written loop over a fixed-signature `tf.function`
writing into a preallocated array, and `tfdist.predict` (its fast path), on one device.

  python -m benchmarks.bench_predict [--rounds 3] [--rows 200000] [--batch 256]
"""

import time

from absl import app, flags

from benchmarks import common

flags.DEFINE_integer("rounds", 3, "Interleaved runs of each contender.")
flags.DEFINE_integer("rows", 200_000, "Rows to predict.")
flags.DEFINE_integer("batch", 256, "Rows per batch.")
FLAGS = flags.FLAGS


def main(argv):
  del argv
  import numpy as np
  import tensorflow as tf

  import tfdist
  x, _ = common.data(FLAGS.rows)
  model = common.model_fn()
  batch = FLAGS.batch

  def timed(run):
    start = time.perf_counter()
    run()
    return FLAGS.rows / (time.perf_counter() - start)

  step = tf.function(lambda t: model(t, training=False),
                     input_signature=[tf.TensorSpec([batch, x.shape[1]], tf.float32)])

  def hand_written():
    out = np.empty((len(x), 10), np.float32)
    for start in range(0, len(x), batch):
      part = x[start:start + batch]
      rows = len(part)
      if rows < batch:
        part = np.concatenate([part, np.zeros((batch - rows, x.shape[1]), np.float32)])
      out[start:start + rows] = step(part).numpy()[:rows]
    return out

  contenders = {
      "Keras predict": lambda: timed(lambda: model.predict(x, batch_size=batch, verbose=0)),
      "hand-written tf.function loop": lambda: timed(hand_written),
      "tfdist.predict": lambda: timed(lambda: tfdist.predict(model, x, batch_size=batch)),
  }
  for run in contenders.values():
    run()  # Trace and warm up each.
  results = common.interleave(contenders, FLAGS.rounds)
  print(common.table(results, "hand-written tf.function loop", unit="rows/s"))


if __name__ == "__main__":
  app.run(main)
