"""A model split over 2 logical CPUs (tfdist.parallel) against the same model unsplit, with
1-8 micro-batches; the GPipe bubble bound (S-1)/(M+S-1) beside them; the estimate of
each stage's variable bytes against the bytes placed there.

Logical CPUs share one thread pool (2 cores here), so this shows the split's overhead, not a
pipeline's speed-up; on GPUs run it with `--devices /device:GPU:0,/device:GPU:1`.

  python -m benchmarks.bench_pipeline [--rounds 3] [--devices ...]
"""

from absl import app, flags

from benchmarks import common

flags.DEFINE_integer("rounds", 3, "Interleaved runs of each contender.")
flags.DEFINE_integer("samples", 16384, "Generated training examples.")
flags.DEFINE_integer("epochs", 3, "Epochs per run; the first is not timed.")
flags.DEFINE_list("devices", [], "The stages' devices; default 2 logical CPUs.")
FLAGS = flags.FLAGS
BATCH = 256


def main(argv):
  del argv
  import tensorflow as tf
  if not FLAGS.devices:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
  import keras

  from tfdist.parallel import estimates
  from tfdist.parallel.split_model import split
  devices = FLAGS.devices or ["/device:CPU:0", "/device:CPU:1"]
  x, y = common.data(FLAGS.samples)

  def model(microbatches=None):
    keras.utils.set_random_seed(0)
    built = common.model_fn()
    built.compile(**common.compile_args())
    if microbatches:
      split(built, "balanced", devices=devices, microbatches=microbatches)
    return built

  def fit(microbatches=None):
    timer = common.EpochTimer()
    model(microbatches).fit(x, y, batch_size=BATCH, epochs=FLAGS.epochs, callbacks=[timer],
                            verbose=0, shuffle=False)
    return len(x) / min(timer.seconds)

  contenders = {"unsplit (one device)": fit}
  contenders.update({f"split, {m} micro-batch(es)": (lambda m=m: fit(m)) for m in (1, 2, 4, 8)})
  results = common.interleave(contenders, FLAGS.rounds)
  print(common.table(results, "unsplit (one device)"))
  stages = len(devices)
  print("\n| micro-batches M | bubble bound (S-1)/(M+S-1), S=%d |\n|---|---|" % stages)
  for m in (1, 2, 4, 8):
    print(f"| {m} | {(stages - 1) / (m + stages - 1):.2f} |")

  plan = estimates.estimate_memory(model(), batch=BATCH, devices=stages)
  placed = model(1)
  placed.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, verbose=0)
  measured = {}
  for variable in placed.weights + placed.optimizer.variables:
    held = variable.value  # What TensorFlow placed: its device and its bytes.
    measured[held.device] = measured.get(held.device, 0) + held.numpy().nbytes
  print("\n| stage | estimated variable bytes | placed | error |\n|---|---|---|---|")
  for k, (stage, device) in enumerate(zip(plan["split"], sorted(measured))):
    error = stage.variables / measured[device] - 1
    print(f"| {k} | {stage.variables:,} | {measured[device]:,} | {error:+.2%} |")


if __name__ == "__main__":
  app.run(main)
