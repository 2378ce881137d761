"""Optimizer-state sharding (`training.zero_stage: 1`), gradient sharding (`zero_stage: 2`)
and parameter sharding (`zero_stage: 3`,
stage 3) against the unsharded run, N = 2, 3 and 4 replicas: as logical CPUs of one process
(mirrored) and as worker processes on 127.0.0.1 (multi_worker_mirrored, each pinned to a core:
more workers than cores share them). The benchmark MLP (1.86 M parameters, Adam, float32, 256
examples per replica per step, 8 steps per call), interleaved rounds in one run. Per setup:
the bytes of variables a replica holds as training ends (weights and optimizer state, counted
from every variable its process holds); examples/s; the ratio to the unsharded run.

Bytes each replica sends per step, from the ring model: unsharded, an all-reduce of the
gradients, 2(N-1)/N x G; stage 1, that plus an all-gather of the weights, (N-1)/N x W; stage 2,
a reduce-scatter, (N-1)/N x G, plus the all-gather; stage 3, the reduce-scatter and an
all-reduce of the weights, 2(N-1)/N x W (gathered a bucket at a time in the step: each
replica's part placed in zeros).

With `--cap` (N logical CPUs of one process, TensorFlow's CPU allocator with statistics, BFC):
the MLP deepened to `CAP_DEPTH` hidden layers (8.16 M parameters, 31.1 MiB of float32, so that
the model's state, not the input pipeline, fills the process) on `CAP_SAMPLES` examples; each
setup's allocator peak over the fit, then each trained again under a cap on that allocator
(`TF_CPU_BFC_MEM_LIMIT_IN_MB`) 2 MiB under the lowest peak but stage 3's: no other setup's
bytes in use fit under it, whatever the allocator does; whether stage 3's do with BFC's
regions and their fragments (a cap halfway between the peaks, 29 MiB above stage 3's, ran
out: its regions grow by doubling, and a 16 MiB buffer fits only in a region with 16 MiB
free in one piece).

With `--peak` (processes only, TensorFlow's CPU allocator with statistics, BFC): each
worker's allocator peak over the steps of epoch 2 and over its whole fit, the most of any
worker (what a replica's memory must hold at once: weights, optimizer state, the step's
gradients and buffers, the input pipeline's), and what each stage saves against the unsharded
run over the steps, beside what `tfdist estimate`'s rows say it saves (the pipeline's bytes,
which the estimate leaves out, cancel). (A step's transient alone, without an input pipeline's
buffers: `python -m tests.programs.step_peak 2 off|optimizer|gradients`.)

  python -m benchmarks.bench_optimizer_sharding [--rounds 1] [--replicas 2,3,4] [--peak|--cap]
"""

import os
import re
import statistics

from absl import app, flags

from benchmarks.bench_scaling import GRADIENT_BYTES, TRAINING, cluster, run, training, value

flags.DEFINE_list("replicas", ["2", "3", "4"], "Replica counts.")
flags.DEFINE_bool("peak", False, "Measure each worker process's allocator peak instead.")
flags.DEFINE_bool("cap", False, "Train each setup under an allocator cap only stage 3 fits.")
FLAGS = flags.FLAGS  # --rounds: bench_scaling's flag (interleaved runs of each setup).
STAGES = {"unsharded": {}, "stage 1": {"zero_stage": "1"}, "stage 2": {"zero_stage": "2"},
          "stage 3": {"zero_stage": "3"}}


def sent(stage: str, n: int) -> float:
  gradients = (n - 1) / n * GRADIENT_BYTES
  return {"unsharded": 2 * gradients, "stage 1": 3 * gradients,
          "stage 2": 2 * gradients, "stage 3": 3 * gradients}[stage]


CAP_DEPTH, CAP_SAMPLES = 8, 2048
ROWS = {"unsharded": "data_parallel", "stage 1": "sharded", "stage 2": "sharded_gradients",
        "stage 3": "sharded_parameters"}


def estimated(n: int) -> dict[str, int]:
  """`tfdist estimate`'s total per replica for each setup: the benchmark MLP, its batch of 256
  per replica, `n` replicas."""
  from benchmarks import common
  from tfdist.parallel import estimates
  from tfdist.training import sharding_memory
  model = common.model_fn()
  model.compile(**common.compile_args())
  plan = estimates.estimate_memory(model, batch=256 * n, devices=1, replicas=n)
  plan.update(sharding_memory.stage_rows(plan))
  return {stage: plan[row].total for stage, row in ROWS.items()}


def peaks(n: int) -> list[str]:
  """Rows of each stage's allocator peak, the most of any of `n` worker processes, and what it
  saves against the unsharded run's, beside what the estimate says it saves (the input
  pipeline's buffers, which the estimate leaves out, cancel)."""
  rows = []
  estimate = estimated(n)
  os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"
  unsharded = None
  for stage, settings in STAGES.items():
    found, steps = [], []
    for _ in range(FLAGS.rounds):
      output = run(cluster(n) + training(TRAINING, **settings), "train", n)
      found.append(max(int(v) for v in re.findall(r"\bPEAK_BYTES (\d+)", output)))
      steps.append(max(int(v) for v in re.findall(r"STEPS_PEAK_BYTES (\d+)", output)))
    unsharded = max(steps) if unsharded is None else unsharded
    rows.append(f"| {n} | {stage} | {statistics.median(steps) / 2**20:.2f} MiB "
                f"({', '.join(f'{f / 2**20:.2f}' for f in steps)}) | "
                f"{statistics.median(found) / 2**20:.2f} MiB "
                f"({', '.join(f'{f / 2**20:.2f}' for f in found)}) | "
                f"{(unsharded - max(steps)) / 2**20:.2f} MiB | "
                f"{(estimate['unsharded'] - estimate[stage]) / 2**20:.2f} MiB |")
  return rows


def capped(n: int) -> list[str]:
  """Rows of each stage on `n` logical CPUs of one process (the deep MLP): its allocator peak
  over the fit, and whether it trains under a cap just under the lowest peak but stage 3's."""
  os.environ.update(TF_CPU_ALLOCATOR_USE_BFC="true", BENCH_DEPTH=str(CAP_DEPTH),
                    SAMPLES=str(CAP_SAMPLES))
  config = f"strategy: mirrored\ndevices: {{logical_cpus: {n}}}\n"
  found = {stage: value(run(config + training(TRAINING, **settings), "train", 1,
                            all_cores=True), "PEAK_BYTES") for stage, settings in STAGES.items()}
  lowest_other = min(peak for stage, peak in found.items() if stage != "stage 3")
  cap = lowest_other - (2 << 20)
  if cap <= found["stage 3"]:
    return [f"| {n} | stage 3's peak is not the lowest here: no cap only it fits |"]
  os.environ["TF_CPU_BFC_MEM_LIMIT_IN_MB"] = str(int(cap / 2**20))
  try:
    rows = []
    for stage, settings in STAGES.items():
      output = run(config + training(TRAINING, **settings), "train", 1, all_cores=True)
      rows.append(f"| {n} | {stage} | {found[stage] / 2**20:.1f} MiB | {cap / 2**20:.0f} MiB | "
                  f"{'trained' if 'EXAMPLES_PER_SECOND' in output else 'out of memory'} |")
    return rows
  finally:
    for name in ("TF_CPU_BFC_MEM_LIMIT_IN_MB", "BENCH_DEPTH", "SAMPLES"):
      del os.environ[name]


def main(argv):
  del argv
  if FLAGS.cap:
    from benchmarks import common
    deep = common.parameters(CAP_DEPTH)
    print(f"Adam, the MLP {CAP_DEPTH} layers deep ({deep:,} parameters, {deep * 4 / 2**20:.1f} "
          f"MiB of float32), {CAP_SAMPLES} examples, N replicas in one process\n")
    print("| N | setup | allocator peak over the fit | cap | under the cap |\n"
          "|---|---|---|---|---|")
    print("\n".join(row for n in FLAGS.replicas for row in capped(int(n))))
    return
  if FLAGS.peak:
    print(f"Adam, benchmark MLP ({GRADIENT_BYTES // 4:,} parameters, "
          f"{GRADIENT_BYTES / 2**20:.2f} MiB of float32)\n")
    print("| N | setup | peak over the steps of epoch 2 (runs) | peak over the whole fit (runs) "
          "| less than unsharded, steps | tfdist estimate's less |\n|---|---|---|---|---|---|")
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
          held[stage] = int(value(output, "HELD_BYTES"))
      base = statistics.median(speed["unsharded"])
      for stage in STAGES:
        runs = speed[stage]
        rows.append(f"| {n} | {where} | {stage} | {held[stage] / 2**20:.2f} MiB | "
                    f"{statistics.median(runs):,.0f} ({', '.join(f'{r:,.0f}' for r in runs)}) "
                    f"| {statistics.median(runs) / base:.2f} | {sent(stage, n) / 2**20:.2f} MiB |")
  print(f"Adam, benchmark MLP ({GRADIENT_BYTES // 4:,} parameters)\n")
  print("| N | replicas as | setup | bytes a replica holds (weights, optimizer state) | "
        "examples/s (runs) | ratio | bytes sent per step per replica (ring model) |")
  print("|---|---|---|---|---|---|---|")
  print("\n".join(rows))


if __name__ == "__main__":
  app.run(main)
