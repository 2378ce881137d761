"""One task of the scaling benchmark, pinned to the core of its index (before TensorFlow starts
its threads; BENCH_ALL_CORES=1: not pinned). Modes:

  train      trains the benchmark MLP through tfdist.fit; worker 0 prints
             `EXAMPLES_PER_SECOND x`, `STEP_SECONDS x`, `LOSSES <one per epoch>` and
             `OPTIMIZER_BYTES x` (the bytes a replica holds beyond the weights, from every
             variable of the process, after the fit) and `HELD_BYTES x` (every variable a
             replica holds as training ends, its weights among them: stage 3's are sharded
             until `tfdist.fit` ends); with TF_CPU_ALLOCATOR_USE_BFC=true also `PEAK_BYTES x`
             (TensorFlow's CPU allocator's peak over the whole fit, this process);
             BENCH_DEPTH=k: k hidden layers (default 2), SAMPLES=n: n examples
  allreduce  all-reduces float32 tensors of growing sizes with the config's implementation;
             worker 0 prints `ALLREDUCE <bytes> <seconds per all-reduce>`

  python -m benchmarks.scaling_task train|allreduce   (under tfdist launch, or alone)
"""

import functools
import json
import os
import statistics
import sys
import time

INDEX = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0)
if os.environ.get("BENCH_ALL_CORES") != "1":  # Else one worker with every core of the host.
  os.sched_setaffinity(0, {INDEX % os.cpu_count()})

import tfdist  # noqa: E402  (after pinning: TensorFlow's threads inherit the affinity)
from benchmarks import common  # noqa: E402

SIZES = [2 ** k for k in range(12, 26, 2)]  # 4 KiB .. 32 MiB of float32


def train(config):
  x, y = common.data(int(os.environ.get("SAMPLES", "16384")))
  timer = common.EpochTimer()
  steps_peak = _steps_peak() if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC") == "true" else None
  held = _held_as_training_ends()
  model_fn = functools.partial(common.model_fn, int(os.environ.get("BENCH_DEPTH", "2")))
  history = tfdist.fit(model_fn, x, y, config=config, compile=common.compile_args,
                       callbacks=[timer, held] + ([steps_peak] if steps_peak else []),
                       verbose=0, shuffle=False)
  losses = history.history["loss"]
  seconds = statistics.median(timer.seconds)
  replicas = tfdist.make_strategy(config).num_replicas_in_sync
  steps = -(-len(x) // tfdist.batch_sizes(config.training, replicas).global_batch_size)
  return [f"EXAMPLES_PER_SECOND {len(x) / seconds}", f"STEP_SECONDS {seconds / steps}",
          "LOSSES " + " ".join(f"{loss:.4f}" for loss in losses),
          f"OPTIMIZER_BYTES {held_bytes(history.model)}", f"HELD_BYTES {held.bytes}"] + \
      peak_bytes() + (
              [f"STEPS_PEAK_BYTES {steps_peak.peak}"] if steps_peak else [])


def _steps_peak():
  """A Keras callback: the allocator's peak over the second epoch's steps (their buffers, and
  what the process holds between them), reset at its start: the first traced and built."""
  import keras
  import tensorflow as tf

  class StepsPeak(keras.callbacks.Callback):
    peak = 0

    def on_epoch_begin(self, epoch, logs=None):
      if epoch == 1:
        tf.config.experimental.reset_memory_stats("CPU:0")

    def on_epoch_end(self, epoch, logs=None):
      if epoch == 1:
        self.peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
  return StepsPeak()


def _held_as_training_ends():
  """A Keras callback: the most bytes of variables any replica's device holds as training
  ends (every variable of the process, found by the garbage collector)."""
  import keras
  from tfdist.testing import held_variables

  class Held(keras.callbacks.Callback):
    bytes = 0

    def on_train_end(self, logs=None):
      self.bytes = max(held_variables().values())
  return Held()


def peak_bytes() -> list[str]:
  """`PEAK_BYTES x` when the CPU allocator keeps statistics (TF_CPU_ALLOCATOR_USE_BFC=true)."""
  if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC") != "true":
    return []
  import tensorflow as tf
  return [f"PEAK_BYTES {tf.config.experimental.get_memory_info('CPU:0')['peak']}"]


def held_bytes(model) -> int:
  """The bytes one replica of this task holds beyond the weights (the optimizer's state), from
  every variable the process holds."""
  from tfdist.testing import held_beyond_weights
  return max(held_beyond_weights(model).values())


def allreduce(config):
  import tensorflow as tf
  strategy = tfdist.make_strategy(config)
  lines = []
  for size in SIZES:
    with strategy.scope():
      value = tf.Variable(tf.ones([size // 4]))

    @tf.function
    def reduce():
      return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
          "sum", value.read_value()))
    reduce()  # Trace, and set the collective up.
    count = max(3, min(50, (64 << 20) // size))
    start = time.perf_counter()
    for _ in range(count):
      result = reduce()
    strategy.experimental_local_results(result)[0].numpy()
    lines.append(f"ALLREDUCE {size} {(time.perf_counter() - start) / count}")
  return lines


def main():
  config = tfdist.load_config()
  lines = {"train": train, "allreduce": allreduce}[sys.argv[1]](config)
  if INDEX != 0:  # Every worker's allocator peak; the rest from worker 0.
    lines = [line for line in lines if line.startswith("PEAK_BYTES")]
  if lines:
    print("\n".join(lines), flush=True)
  os._exit(0)  # Skip TensorFlow's slow teardown of the cluster's channels.


if __name__ == "__main__":
  main()
