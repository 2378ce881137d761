"""What the hang watch's recording costs a training run (`tfdist.progress`): `tfdist.fit` as a
launched task runs it (the phase marks around every callback hook and the input's batches
counted by a TensorFlow counter) against the same fit with the count off and against plain
Keras's `model.fit`, on one device, a tiny model and a small batch (the worst case: the
per-batch cost is largest against the step), one and 32 steps per call. The counted runs come
last: `tfdist.progress.watch()`, as a launched task's heartbeat calls it, is not undone.

  python -m benchmarks.bench_progress [--rounds 3]
"""

from absl import app, flags

from benchmarks import common

flags.DEFINE_integer("rounds", 3, "Interleaved runs of each contender.")
flags.DEFINE_integer("samples", 32768, "Generated training examples.")
flags.DEFINE_integer("epochs", 3, "Epochs per run; the first is not timed.")
FLAGS = flags.FLAGS
BATCH = 32


def main(argv):
  del argv
  import keras
  import numpy as np

  import tfdist
  import tfdist.progress as progress
  rng = np.random.default_rng(0)
  x = rng.normal(size=(FLAGS.samples, 16)).astype("float32")
  y = (x[:, 0] > 0).astype("int32")

  def model_fn():
    return keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(2)])

  def compile_args():
    return dict(optimizer="adam",
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

  def fit(per_call):
    timer = common.EpochTimer()
    config = {"training": {"global_batch_size": BATCH, "mixed_precision": "off",
                           "steps_per_execution": per_call}}
    tfdist.fit(model_fn, x, y, config=config, compile=compile_args, epochs=FLAGS.epochs,
               callbacks=[timer], verbose=0, shuffle=False)
    return len(x) / min(timer.seconds)

  def plain(per_call):
    timer = common.EpochTimer()
    model = model_fn()
    model.compile(**compile_args(), steps_per_execution=per_call)
    model.fit(x, y, batch_size=BATCH, epochs=FLAGS.epochs, callbacks=[timer], verbose=0,
              shuffle=False)
    return len(x) / min(timer.seconds)

  results = {per_call: common.interleave({
      "plain Keras fit": lambda: plain(per_call),
      "tfdist.fit, input not counted": lambda: fit(per_call)}, FLAGS.rounds)
      for per_call in (1, 32)}
  progress.watch()  # As a launched task's heartbeat does; a process is not unwatched.
  for per_call in (1, 32):
    results[per_call].update(common.interleave(
        {"tfdist.fit as launched (counted)": lambda: fit(per_call)}, FLAGS.rounds))
    print(f"\n{per_call} step(s) per call, batch {BATCH}:")
    print(common.table(results[per_call], "plain Keras fit"))


if __name__ == "__main__":
  app.run(main)
