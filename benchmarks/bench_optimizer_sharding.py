"""Optimizer-state sharding (`training.shard_optimizer`, ZeRO stage 1) and gradient sharding
(`training.shard_gradients`, stage 2) against the unsharded run, N = 2, 3 and 4 replicas: as
logical CPUs of one process (mirrored) and as worker processes on 127.0.0.1
(multi_worker_mirrored, each pinned to a core: more workers than cores share them). The
benchmark MLP (1.86 M parameters, Adam, float32, 256 examples per replica per step, 8 steps per
call), interleaved rounds in one run. Per setup: the bytes a replica holds beyond the weights,
counted from every variable its process holds; examples/s; the ratio to the unsharded run.

Bytes each replica sends per step, from the ring model: unsharded, an all-reduce of the
gradients, 2(N-1)/N x G; stage 1, that plus an all-gather of the weights, (N-1)/N x W; stage 2,
a reduce-scatter, (N-1)/N x G, plus the all-gather.

With `--peak` (processes only, TensorFlow's CPU allocator with statistics, BFC): each
worker's allocator peak over the steps of epoch 2 and over its whole fit, the most of any
worker: what a replica's memory must hold at once, weights, optimizer state and the step's
gradients and buffers together. (A step's transient alone, without an input pipeline's
buffers: `python -m tests.programs.step_peak 2 off|optimizer|gradients`.)

  python -m benchmarks.bench_optimizer_sharding [--rounds 1] [--replicas 2,3,4] [--peak]
"""

import os
import re
import statistics

from absl import app, flags

from benchmarks.bench_scaling import GRADIENT_BYTES, TRAINING, cluster, run, training, value

flags.DEFINE_list("replicas", ["2", "3", "4"], "Replica counts.")
flags.DEFINE_bool("peak", False, "Measure each worker process's allocator peak instead.")
FLAGS = flags.FLAGS  # --rounds: bench_scaling's flag (interleaved runs of each setup).
STAGES = {"unsharded": {}, "stage 1": {"shard_optimizer": "true"},
          "stage 2": {"shard_optimizer": "true", "shard_gradients": "true"}}


def sent(stage: str, n: int) -> float:
  gradients = (n - 1) / n * GRADIENT_BYTES
  return {"unsharded": 2 * gradients, "stage 1": 3 * gradients,
          "stage 2": 2 * gradients}[stage]


def peaks(n: int) -> list[str]:
  """Rows of each stage's allocator peak, the most of any of `n` worker processes."""
  rows = []
  os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
  for stage, settings in STAGES.items():
    found, steps = [], []
    for _ in range(FLAGS.rounds):
      output = run(cluster(n) + training(TRAINING, **settings), "train", n)
      found.append(max(int(v) for v in re.findall(r"\bPEAK_BYTES (\d+)", output)))
      steps.append(max(int(v) for v in re.findall(r"STEPS_PEAK_BYTES (\d+)", output)))
    rows.append(f"| {n} | {stage} | {statistics.median(steps) / 2**20:.2f} MiB "
                f"({', '.join(f'{f / 2**20:.2f}' for f in steps)}) | "
                f"{statistics.median(found) / 2**20:.2f} MiB "
                f"({', '.join(f'{f / 2**20:.2f}' for f in found)}) |")
  return rows


def main(argv):
  del argv
  if FLAGS.peak:
    print(f"Adam, benchmark MLP ({GRADIENT_BYTES // 4:,} parameters, "
          f"{GRADIENT_BYTES / 2**20:.2f} MiB of float32)\n")
    print("| N | setup | peak over the steps of epoch 2 (runs) | peak over the whole fit (runs) |"
          "\n|---|---|---|---|")
    print("\n".join(row for n in FLAGS.replicas for row in peaks(int(n))))
    return
  rows = []
  for n in (int(r) for r in FLAGS.replicas):
    for where in ("logical CPUs", "processes"):
      speed, held = {s: [] for s in STAGES}, {}
      for _ in range(FLAGS.rounds):
        for stage, settings in STAGES.items():
          train = training(TRAINING, **settings)
          if where == "processes":
            output = run(cluster(n) + train, "train", n)
          else:
            output = run(f"strategy: mirrored\ndevices: {{logical_cpus: {n}}}\n" + train,
                         "train", 1, all_cores=True)
          speed[stage].append(value(output, "EXAMPLES_PER_SECOND"))
          held[stage] = int(value(output, "OPTIMIZER_BYTES"))
      base = statistics.median(speed["unsharded"])
      for stage in STAGES:
        runs = speed[stage]
        rows.append(f"| {n} | {where} | {stage} | {held[stage] / 2**20:.2f} MiB | "
                    f"{statistics.median(runs):,.0f} ({', '.join(f'{r:,.0f}' for r in runs)}) "
                    f"| {statistics.median(runs) / base:.2f} | {sent(stage, n) / 2**20:.2f} MiB |")
  print(f"Adam, benchmark MLP ({GRADIENT_BYTES // 4:,} parameters)\n")
  print("| N | replicas as | setup | bytes a replica holds beyond the weights | examples/s "
        "(runs) | ratio | bytes sent per step per replica (ring model) |")
  print("|---|---|---|---|---|---|---|")
  print("\n".join(rows))


if __name__ == "__main__":
  app.run(main)
