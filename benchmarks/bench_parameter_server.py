"""Parameter-server training: steps/s with 1 and 2 workers (plus a ps and the chief, all on
this machine), steps per scheduled call 1 / 8 / 32, TensorFlow's hand-written coordinator
loop (one step per call, loss and accuracy metrics, as TensorFlow's guide writes it), and the
same model under MultiWorkerMirrored with 2 workers. float32, Keras's own optimizer update (as
by hand) except in the contender named "fused update", batch 256 per step, the benchmark MLP;
each run is one `tfdist launch` of a fresh cluster, contenders interleaved.

  python -m benchmarks.bench_parameter_server [--rounds 2]
"""

import pathlib
import re
import subprocess
import sys
import tempfile

from absl import app, flags

from benchmarks import common
from benchmarks.cluster_steps import BATCH, EPOCHS, STEPS

flags.DEFINE_integer("rounds", 2, "Interleaved runs of each contender.")
FLAGS = flags.FLAGS
REPO = pathlib.Path(__file__).resolve().parent.parent

PS1, PS2 = "{chief: 1, worker: 1, ps: 1}", "{chief: 1, worker: 2, ps: 1}"
# name -> (cluster, strategy, steps per call, program mode, fused optimizer update)
CONTENDERS = {
    "PS, 1 worker, tfdist, 1 step/call": (PS1, "parameter_server", 1, "tfdist", False),
    "PS, 2 workers, by hand, 1 step/call": (PS2, "parameter_server", 1, "by_hand", False),
    "PS, 2 workers, tfdist, 1 step/call": (PS2, "parameter_server", 1, "tfdist", False),
    "PS, 2 workers, tfdist, 8 steps/call": (PS2, "parameter_server", 8, "tfdist", False),
    "PS, 2 workers, tfdist, 32 steps/call": (PS2, "parameter_server", 32, "tfdist", False),
    "PS, 2 workers, tfdist, 8 steps/call, fused update": (PS2, "parameter_server", 8, "tfdist", True),
    "MWMS, 2 workers, tfdist, 8 steps/call": ("{worker: 2}", "multi_worker_mirrored", 8, "tfdist", False),
}


def run(cluster: str, strategy: str, per_call: int, mode: str, fused: bool) -> float:
  # MWMS's global batch is split over its 2 workers; give it 2 x 256 so a step is 256 each.
  batch = BATCH * (2 if strategy == "multi_worker_mirrored" else 1)
  with tempfile.TemporaryDirectory() as tmp:
    config = pathlib.Path(tmp, "config.yaml")
    config.write_text(f"cluster: {cluster}\nstrategy: {strategy}\ntraining: "
                      f"{{global_batch_size: {batch}, steps_per_epoch: {STEPS}, epochs: {EPOCHS}, "
                      f"steps_per_execution: {per_call}, mixed_precision: 'off', "
                      f"fused_optimizer: {str(fused).lower()}}}\n")
    out = subprocess.run([sys.executable, "-m", "tfdist", "launch", str(config), "--logs",
                          str(pathlib.Path(tmp, "logs")), "--", sys.executable, "-m",
                          "benchmarks.cluster_steps", mode],
                         capture_output=True, text=True, check=True, cwd=REPO, timeout=900).stdout
  return float(re.search(r"STEPS_PER_SECOND ([\d.]+)", out).group(1))


def main(argv):
  del argv
  results = common.interleave({name: (lambda c=c: run(*c)) for name, c in CONTENDERS.items()},
                              FLAGS.rounds)
  print(common.table(results, "PS, 2 workers, by hand, 1 step/call", unit="steps/s"))


if __name__ == "__main__":
  app.run(main)
