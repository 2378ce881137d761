"""Preemption benchmark: a 2-worker MultiWorkerMirrored run (tests/programs/resumable.py: 6
epochs of 8 steps, each call 0.2 s longer) gets SIGTERM through `tfdist launch` after a random
call; per trial, the steps run between the notice and the save (at most a call's; they are
kept, not redone), the seconds from SIGTERM to the launcher's exit (42), and, after a
relaunch, the largest difference of the final weights from an uninterrupted run.

  python -m benchmarks.bench_preemption [--trials 3] [--steps_per_execution 4]
"""

import json
import os
import pathlib
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

from absl import app, flags

flags.DEFINE_integer("trials", 3, "Preemptions, each at a random moment.")
flags.DEFINE_integer("steps_per_execution", 4, "Steps per call: the most a notice may wait.")
FLAGS = flags.FLAGS
REPO = pathlib.Path(__file__).resolve().parent.parent
PROGRAM = REPO / "tests" / "programs" / "resumable.py"


def launch(config: pathlib.Path, env: dict) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, "-m", "tfdist", "launch", str(config), "--verbose",
                           "--grace-period", "25", "--", sys.executable, str(PROGRAM)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, **env}, cwd=config.parent, start_new_session=True)


def result(output: str):
  import numpy as np
  line = next(line for line in output.splitlines() if "RESULT " in line)
  return [np.asarray(w) for w in json.loads(line.split("RESULT ", 1)[1])]


def main(_):
  import numpy as np
  env = {"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2",
         "STEPS_PER_EXECUTION": str(FLAGS.steps_per_execution)}
  rng = random.Random(0)
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    plain = tmp / "plain.yaml"
    plain.write_text("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
    reference = launch(plain, env)
    expected = result(reference.communicate(timeout=600)[0])
    for trial in range(FLAGS.trials):
      config = tmp / f"trial{trial}.yaml"
      config.write_text(plain.read_text() + f"checkpoint: {{dir: {tmp / f'ck{trial}'}}}\n")
      first = launch(config, {**env, "STEP_LINES": "1"})
      calls = 6 * 8 // FLAGS.steps_per_execution
      target, seen, output = rng.randrange(calls // 4, calls - 1), 0, ""
      while seen <= target:  # A random call of the run's, past its start-up.
        line = first.stdout.readline()
        output += line
        seen += "] STEP " in line
      sent = time.monotonic()
      first.send_signal(signal.SIGTERM)  # The launcher forwards it, as under Slurm or Kubernetes.
      output += first.communicate(timeout=120)[0]
      seconds = time.monotonic() - sent
      saved = re.search(r"backup saved at epoch (\d+), step (\d+)", output)
      before = output[:output.find("SIGTERM received")]
      noticed = re.findall(r"\[worker-0\] STEP (\d+) (\d+)", before)[-1:]  # The last call.
      second = launch(config, env)
      weights = result(second.communicate(timeout=600)[0])
      difference = max(float(np.max(np.abs(a - b))) for a, b in zip(weights, expected))
      saved_at = (int(saved.group(1)), int(saved.group(2))) if saved else None
      at_notice = (int(noticed[0][0]) + 1, int(noticed[0][1])) if noticed else None
      after = (8 * (saved_at[0] - at_notice[0]) + saved_at[1] - at_notice[1]
               if saved_at and at_notice else None)  # Steps run after the notice, kept.
      rows.append((trial, first.returncode, saved_at, at_notice, after, seconds,
                   second.returncode, difference))
  print(f"steps per call {FLAGS.steps_per_execution}; 2 workers, 8 steps an epoch; steps lost "
        "to a notice: 0 (the saved steps are not run again)")
  print(f"{'trial':>5} {'exit':>5} {'notice after (epoch, step)':>27} {'saved at':>9} "
        f"{'steps after notice':>19} {'SIGTERM->exit s':>16} {'resumed exit':>13} "
        f"{'max |w - w_ref|':>16}")
  for trial, code, saved_at, at_notice, after, seconds, code2, difference in rows:
    print(f"{trial:>5} {code:>5} {str(at_notice):>27} {str(saved_at):>9} {str(after):>19} "
          f"{seconds:>16.2f} {code2:>13} {difference:>16.2e}")


if __name__ == "__main__":
  app.run(main)
