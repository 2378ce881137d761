"""tf.data input against numpy input under MirroredStrategy (2 logical CPUs), through
`tfdist.fit`, as a user ports a script: numpy arrays; a tf.data pipeline built the usual way
(from_tensor_slices, batch, prefetch); a dataset function (each replica's batches). Same model,
data, global batch and config (float32, tfdist's default steps per call).

  python -m benchmarks.bench_input [--rounds 3]
"""

from absl import app, flags

from benchmarks import common

flags.DEFINE_integer("rounds", 3, "Interleaved runs of each contender.")
flags.DEFINE_integer("samples", 16384, "Generated training examples.")
flags.DEFINE_integer("epochs", 4, "Epochs per run; the first is not timed.")
FLAGS = flags.FLAGS
BATCH = 256


def main(argv):
  del argv
  import tensorflow as tf

  import tfdist
  config = {"strategy": "mirrored", "devices": {"logical_cpus": 2},
            "training": {"global_batch_size": BATCH, "mixed_precision": "off"}}
  tfdist.make_strategy(config)  # Devices split before the data is made.
  x, y = common.data(FLAGS.samples)

  def fit(data, labels=None):
    timer = common.EpochTimer()
    tfdist.fit(common.model_fn, data, labels, config=config, compile=common.compile_args,
               epochs=FLAGS.epochs, callbacks=[timer], verbose=0, shuffle=False)
    return len(x) / min(timer.seconds)

  def dataset():
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).prefetch(tf.data.AUTOTUNE)

  def dataset_fn(context):
    return (tf.data.Dataset.from_tensor_slices((x, y))
            .batch(context.get_per_replica_batch_size(BATCH)).prefetch(tf.data.AUTOTUNE))

  results = common.interleave({
      "numpy": lambda: fit(x, y),
      "tf.data Dataset": lambda: fit(dataset()),
      "dataset function": lambda: fit(dataset_fn)}, FLAGS.rounds)
  print(common.table(results, "numpy"))


if __name__ == "__main__":
  app.run(main)
