"""Time from start to the first finished training step of a local 2-worker MultiWorkerMirrored
cluster, and the CPU-seconds of the whole run (every process it started): `tfdist launch` (its
tasks forked from one preloaded TensorFlow) and `tfdist launch --preload off` vs the same two
processes started by hand with their TF_CONFIG. Target: ratio <= 1.1. With `--ray_address`,
also `tfdist launch --backend ray` on that Ray cluster (its actors placed, its tasks started in
them, output streamed back).

  python -m benchmarks.bench_launch_latency [--rounds 3] [--ray_address 127.0.0.1:6379]
"""

import os
import pathlib
import re
import resource
import subprocess
import sys
import tempfile
import time

from absl import app, flags

from benchmarks import common

flags.DEFINE_integer("rounds", 3, "Interleaved runs of each contender.")
flags.DEFINE_string("ray_address", None, "A running Ray cluster (RAY_ADDRESS): also time "
                    "`tfdist launch --backend ray` there.")
FLAGS = flags.FLAGS
PROGRAM = [sys.executable, "-m", "benchmarks.first_step"]
CONFIG = "cluster: {worker: 2}\nstrategy: multi_worker_mirrored\ntraining: {steps_per_execution: 1}\n"
REPO = pathlib.Path(__file__).resolve().parent.parent


CPU: dict[str, list[float]] = {}


def _children_cpu() -> float:
  used = resource.getrusage(resource.RUSAGE_CHILDREN)
  return used.ru_utime + used.ru_stime


def counting_cpu(name: str, run):
  """`run`, its children's CPU-seconds recorded under `name` in `CPU`."""
  def counted() -> float:
    before = _children_cpu()
    seconds = run()
    CPU.setdefault(name, []).append(_children_cpu() - before)
    return seconds
  return counted


def _first_steps(texts) -> float:
  return max(float(t) for text in texts for t in re.findall(r"FIRST_STEP ([\d.]+)", text))


def with_launcher(config: str, *flags_, env=None) -> float:
  start = time.time()
  out = subprocess.run([sys.executable, "-m", "tfdist", "launch", config, *flags_, "--",
                        *PROGRAM], capture_output=True, text=True, check=True, cwd=REPO,
                       timeout=300, env={**os.environ, **(env or {})}).stdout
  return _first_steps([out]) - start


def by_hand(config: str) -> float:
  from tfdist.config import load_config
  from tfdist.config.tf_config import tf_config_json
  from tfdist.machine.ports import free_ports
  from tfdist.config.tf_config import with_local_addresses
  cluster = load_config(config, environ={}).cluster
  start = time.time()
  cluster = with_local_addresses(cluster, free_ports(2))
  processes = [subprocess.Popen(PROGRAM, cwd=REPO, stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "TF_CONFIG": tf_config_json(cluster, task),
                                     "TFDIST_CONFIG": config})
               for task in cluster.tasks()]
  outs = [p.communicate(timeout=300)[0] for p in processes]
  return _first_steps(outs) - start


def main(argv):
  del argv
  with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
    f.write(CONFIG)
  contenders = {"by hand": lambda: by_hand(f.name),
                "tfdist launch": lambda: with_launcher(f.name),
                "tfdist launch --preload off": lambda: with_launcher(f.name, "--preload", "off")}
  if FLAGS.ray_address:
    contenders["tfdist launch --backend ray"] = lambda: with_launcher(
        f.name, "--backend", "ray", env={"RAY_ADDRESS": FLAGS.ray_address})
  results = common.interleave({name: counting_cpu(name, run)
                               for name, run in contenders.items()}, FLAGS.rounds)
  print(common.table(results, "by hand", unit="seconds to first step"))
  print(common.table(CPU, "by hand", unit="CPU-seconds of the run"))


if __name__ == "__main__":
  app.run(main)
