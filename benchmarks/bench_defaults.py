"""(b) tfdist's defaults vs a plain Keras script on the same model, data and batch size.

Plain Keras: `model.fit(x, y, batch_size=256)` on numpy arrays, everything else Keras's default.
tfdist: `tfdist.fit` with the default config (mixed_precision auto, steps_per_execution 32,
Keras's own optimizer update, tf.data input with prefetch), and the same with the fused
updates (`training.fused_optimizer: true`, off by default: Adam's kernel is not Keras's
arithmetic). Target: ratio >= 2.0 on the CPU here.

  python benchmarks/bench_defaults.py [--rounds 3]
"""

from absl import app, flags

from benchmarks import common

flags.DEFINE_integer("rounds", 3, "Interleaved runs of each contender.")
flags.DEFINE_integer("samples", 16384, "Generated training examples.")
flags.DEFINE_integer("epochs", 5, "Epochs per run; the first is not timed.")
FLAGS = flags.FLAGS
BATCH = 256


def main(argv):
  del argv
  import tfdist
  x, y = common.data(FLAGS.samples)

  def plain_keras():
    model = common.model_fn()
    model.compile(**common.compile_args())
    timer = common.EpochTimer()
    model.fit(x, y, batch_size=BATCH, epochs=FLAGS.epochs, callbacks=[timer], verbose=0)
    return len(x) / min(timer.seconds)

  def tfdist_fit(**training):
    timer = common.EpochTimer()
    tfdist.fit(common.model_fn, x, y, config={"training": {"global_batch_size": BATCH, **training}},
               compile=common.compile_args, epochs=FLAGS.epochs, callbacks=[timer], verbose=0)
    return len(x) / min(timer.seconds)

  results = common.interleave({
      "plain Keras": plain_keras,
      "tfdist defaults": tfdist_fit,
      "tfdist defaults + fused_optimizer: true": lambda: tfdist_fit(fused_optimizer=True)},
      FLAGS.rounds)
  print(common.table(results, "plain Keras"))


if __name__ == "__main__":
  app.run(main)
