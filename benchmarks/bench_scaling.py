"""Weak scaling of MultiWorkerMirrored on this machine: 1 worker on one core vs 2 workers, each
pinned to its own core, the same 256 examples per worker per step (benchmark MLP, Adam,
float32, 8 steps per call); efficiency = 2-worker examples/s / (2 x 1-worker examples/s).
Where a 2-worker step goes: compute and input (the 1-worker step) and the rest (all-reduce and
waiting). Then all-reduce bus bandwidth over tensor sizes, ring and auto, as nccl-tests define
it: busbw = 2(n-1)/n x bytes / time.

With `gradient_compression: bfloat16` (half the all-reduce's bytes) and local gradient
accumulation over 4 batches (one all-reduce per update), each against the 1-worker run of the
same training options.

  python -m benchmarks.bench_scaling [--rounds 2]
"""

import os
import re
import statistics
import subprocess
import sys
import tempfile

from absl import app, flags

flags.DEFINE_integer("rounds", 2, "Interleaved runs of each setup.")
FLAGS = flags.FLAGS
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINING = ("training: {per_replica_batch_size: 256, epochs: 4, steps_per_execution: 8, "
            "mixed_precision: off, fused_optimizer: true}\n")


def run(config_text: str, mode: str, workers: int) -> str:
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "config.yaml")
    with open(path, "w") as f:
      f.write(config_text)
    command = [sys.executable, "-m", "benchmarks.scaling_task", mode]
    env = {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"}
    if workers == 1:
      argv, env = command, {**env, "TFDIST_CONFIG": path}
    else:
      argv = [sys.executable, "-m", "tfdist", "launch", path, "--logs", tmp, "--", *command]
    return subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=900).stdout


def value(output: str, name: str) -> float:
  return float(re.search(rf"{name} ([\d.e+-]+)", output).group(1))


def main(argv):
  del argv
  two = "cluster: {worker: 2}\nstrategy: {name: multi_worker_mirrored, communication: %s}\n"
  bf16 = ("cluster: {worker: 2}\nstrategy: {name: multi_worker_mirrored, "
          "gradient_compression: bfloat16}\n")
  accumulate = TRAINING.replace("}", ", gradient_accumulation_steps: 4}")
  # (name, config, workers, the 1-worker setup it scales)
  # The 1-worker runs use mirrored on their one CPU: tfdist's step loop, as the 2 workers do
  # (the default strategy runs Keras's own loop, 1.0-1.2x slower here).
  one = "strategy: mirrored\n"
  setups = [("1 worker", one + TRAINING, 1, None),
            ("2 workers (auto)", two % "auto" + TRAINING, 2, "1 worker"),
            ("2 workers, bfloat16 all-reduce", bf16 + TRAINING, 2, "1 worker"),
            ("1 worker, accumulation 4", one + accumulate, 1, None),
            ("2 workers, local accumulation 4", two % "auto" + accumulate, 2,
             "1 worker, accumulation 4"),
            ("2 workers, local accumulation 4, bfloat16", bf16 + accumulate, 2,
             "1 worker, accumulation 4")]
  results = {name: [] for name, *_ in setups}
  steps = {name: [] for name in results}
  for _ in range(FLAGS.rounds):
    for name, text, workers, _ in setups:
      output = run(text, "train", workers)
      results[name].append(value(output, "EXAMPLES_PER_SECOND"))
      steps[name].append(value(output, "STEP_SECONDS"))
  print("| setup | examples/s (runs) | step ms | efficiency |\n|---|---|---|---|")
  for name, text, workers, base in setups:
    single = statistics.median(results[base or name])
    runs = results[name]
    print(f"| {name} | {statistics.median(runs):,.0f} ({', '.join(f'{r:,.0f}' for r in runs)}) "
          f"| {1e3 * statistics.median(steps[name]):.1f} | "
          f"{statistics.median(runs) / (workers * single):.2f} |")
  for name, _, workers, base in setups:
    if workers == 2:
      total, compute = statistics.median(steps[name]), statistics.median(steps[base])
      print(f"\n{name}: a step of {1e3 * total:.1f} ms = compute and input {1e3 * compute:.1f} "
            f"ms + all-reduce and waiting {1e3 * (total - compute):.1f} ms")
  print("\n| bytes | ring busbw MB/s | auto busbw MB/s |\n|---|---|---|")
  tables = {impl: dict(re.findall(r"ALLREDUCE (\d+) ([\d.e+-]+)", run(
      two % impl + "training: {global_batch_size: 2}\n", "allreduce", 2)))
      for impl in ("ring", "auto")}
  for size in tables["ring"]:
    bus = {impl: 2 * (2 - 1) / 2 * int(size) / float(t[size]) / 1e6 for impl, t in tables.items()}
    print(f"| {int(size):,} | {bus['ring']:,.0f} | {bus['auto']:,.0f} |")


if __name__ == "__main__":
  app.run(main)
