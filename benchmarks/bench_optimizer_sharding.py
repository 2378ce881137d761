"""Optimizer-state sharding (`training.shard_optimizer`, issue 34) against the unsharded run: 2
MultiWorkerMirrored workers on 127.0.0.1, each pinned to a core, the benchmark MLP (1.86 M
parameters, Adam, float32, 256 examples per worker per step, 8 steps per call), interleaved
rounds in one run. Per setup: the optimizer bytes each worker holds (counted from its
optimizer's variables), examples/s, and the ratio to the unsharded run (target >= 0.9).

The bytes each worker sends and receives per step, from the ring model: unsharded, an
all-reduce of the gradients, 2(N-1)/N x G; sharded, that plus an all-gather of the weights,
(N-1)/N x W (TensorFlow's collectives offer these strategies no reduce-scatter).

  python -m benchmarks.bench_optimizer_sharding [--rounds 1]
"""

import statistics

from absl import app, flags

from benchmarks.bench_scaling import GRADIENT_BYTES, TRAINING, cluster, run, value

FLAGS = flags.FLAGS  # --rounds: bench_scaling's flag (interleaved runs of each setup).
WORKERS = 2


def main(argv):
  del argv
  sharded = TRAINING.replace("}", ", shard_optimizer: true}")
  setups = {"unsharded": cluster(WORKERS) + TRAINING, "sharded": cluster(WORKERS) + sharded}
  speed = {name: [] for name in setups}
  held = {}
  for _ in range(FLAGS.rounds):
    for name, text in setups.items():
      output = run(text, "train", WORKERS)
      speed[name].append(value(output, "EXAMPLES_PER_SECOND"))
      held[name] = int(value(output, "OPTIMIZER_BYTES"))
  base = statistics.median(speed["unsharded"])
  ring = 2 * (WORKERS - 1) / WORKERS * GRADIENT_BYTES
  sent = {"unsharded": ring, "sharded": ring + (WORKERS - 1) / WORKERS * GRADIENT_BYTES}
  print(f"{WORKERS} workers, Adam, benchmark MLP ({GRADIENT_BYTES // 4:,} parameters)\n")
  print("| setup | optimizer bytes per worker | examples/s (runs) | ratio | "
        "bytes sent per step per worker |")
  print("|---|---|---|---|---|")
  for name in setups:
    runs = speed[name]
    print(f"| {name} | {held[name] / 2**20:.2f} MiB | {statistics.median(runs):,.0f} "
          f"({', '.join(f'{r:,.0f}' for r in runs)}) | {statistics.median(runs) / base:.2f} | "
          f"{sent[name] / 2**20:.2f} MiB |")


if __name__ == "__main__":
  app.run(main)
