"""(c) Achieved FLOP/s of tfdist training as a fraction of this machine's measured matmul peak.

Training FLOPs per example are taken as 6 x parameters (forward 2, backward 4) for the MLP
784-1024-1024-10; the peak is the one TensorBoard's epoch_mfu uses (`tfdist.machine.speed`:
a 2048^3 matmul on a CPU, 8192^3 on a GPU, cached per machine), float32 and bfloat16.

  python benchmarks/bench_flops.py
"""


from absl import app, flags

from benchmarks import common

flags.DEFINE_integer("samples", 16384, "Generated training examples.")
flags.DEFINE_integer("epochs", 4, "Epochs per run; the first is not timed.")
FLAGS = flags.FLAGS
BATCH = 256


def matmul_peak(dtype) -> float:
  from tfdist.machine.speed import matmul_peak as peak  # The one TensorBoard's MFU uses.
  return peak(dtype.name).flops


def main(argv):
  del argv
  import tensorflow as tf

  import tfdist
  x, y = common.data(FLAGS.samples)
  rows = ["| precision | matmul peak GFLOP/s | training samples/s | achieved GFLOP/s | "
          "fraction of peak |", "|---|---|---|---|---|"]
  for precision, dtype in (("off", tf.float32), ("bfloat16", tf.bfloat16)):
    peak = matmul_peak(dtype)
    timer = common.EpochTimer()
    tfdist.fit(common.model_fn, x, y,
               config={"training": {"global_batch_size": BATCH, "mixed_precision": precision}},
               compile=common.compile_args, epochs=FLAGS.epochs, callbacks=[timer], verbose=0)
    samples = len(x) / min(timer.seconds)
    achieved = 6 * common.parameters() * samples
    rows.append(f"| {precision} | {peak / 1e9:,.0f} | {samples:,.0f} | {achieved / 1e9:,.0f} | "
                f"{achieved / peak:.2f} |")
  print("\n".join(rows))


if __name__ == "__main__":
  app.run(main)
