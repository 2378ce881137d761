"""(a) tfdist vs the same training written by hand with tf.distribute and Keras: same strategy,
model, data, batch, precision and steps_per_execution. Target: ratio >= 0.98.

By hand: the strategy made directly, the model built and compiled in its scope, a tf.data
pipeline (shuffle, batch, prefetch), `model.fit`. Under Mirrored only what works by hand is
compared: float32 and one step per call (Keras 3 fails with more, keras#19246). tfdist runs
with `fused_optimizer: false`, the update the by-hand script has (bench_defaults measures it).

Each run is a fresh process (two MirroredStrategy objects in one process share collective
keys), the contenders alternating.

  python -m benchmarks.bench_vs_hand_written [--rounds 3]
"""

import subprocess
import sys

from absl import app, flags

from benchmarks import common

flags.DEFINE_integer("rounds", 3, "Interleaved runs of each contender.")
flags.DEFINE_integer("samples", 16384, "Generated training examples.")
flags.DEFINE_integer("epochs", 3, "Epochs per run; the first is not timed.")
flags.DEFINE_string("run", None, "Internal: run one contender (by_hand or tfdist) and print "
                    "its samples/s.")
flags.DEFINE_string("setting", None, "Internal: the setting of --run.")
FLAGS = flags.FLAGS
BATCH = 256

# name -> (strategy, Keras dtype policy, steps_per_execution)
SETTINGS = {
    "default, bfloat16, 32 steps/call": ("default", "mixed_bfloat16", 32),
    "mirrored 2 CPUs, float32, 1 step/call": ("mirrored", "float32", 1),
}


def by_hand(x, y, strategy_name, policy, steps):
  import keras
  import tensorflow as tf
  strategy = (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
              if strategy_name == "mirrored" else tf.distribute.get_strategy())
  keras.config.set_dtype_policy(policy)
  with strategy.scope():
    model = common.model_fn()
    model.layers[-1].dtype_policy = "float32"
    model.compile(**common.compile_args(), steps_per_execution=steps)
  dataset = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0)
             .batch(BATCH).prefetch(tf.data.AUTOTUNE))
  timer = common.EpochTimer()
  model.fit(dataset, epochs=FLAGS.epochs, callbacks=[timer], verbose=0)
  return len(x) / min(timer.seconds)


def with_tfdist(x, y, strategy_name, policy, steps):
  import tfdist
  precision = {"mixed_bfloat16": "bfloat16", "float32": "off"}[policy]
  config = {"strategy": strategy_name, "devices": {"logical_cpus": 2},
            "training": {"global_batch_size": BATCH, "mixed_precision": precision,
                         "steps_per_execution": steps, "fused_optimizer": False}}
  timer = common.EpochTimer()
  tfdist.fit(common.model_fn, x, y, config=config, compile=common.compile_args,
             epochs=FLAGS.epochs, callbacks=[timer], verbose=0)
  return len(x) / min(timer.seconds)


def run_in_process(contender: str, setting: str) -> float:
  argv = [sys.executable, "-m", "benchmarks.bench_vs_hand_written", f"--run={contender}",
          f"--setting={setting}", f"--samples={FLAGS.samples}", f"--epochs={FLAGS.epochs}"]
  out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=600).stdout
  return float(out.split()[-1])


def main(argv):
  del argv
  if FLAGS.run:
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    x, y = common.data(FLAGS.samples)
    run = {"by_hand": by_hand, "tfdist": with_tfdist}[FLAGS.run]
    print(run(x, y, *SETTINGS[FLAGS.setting]))
    return
  for name in SETTINGS:
    results = common.interleave(
        {"by hand": lambda: run_in_process("by_hand", name),
         "tfdist": lambda: run_in_process("tfdist", name)}, FLAGS.rounds)
    print(f"\n{name}\n" + common.table(results, "by hand"), flush=True)


if __name__ == "__main__":
  app.run(main)
