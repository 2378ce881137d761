"""How fast tfdist reacts when a job must end: a worker of a local 2-worker cluster SIGKILLed
(to the launcher's exit, naming it), Ctrl-C to `tfdist launch` (to every task gone), Ctrl-C to
`tfdist tensorboard` (to its exit; TensorBoard's own server ignores SIGINT). The tests check
what happens; these are the times, measured here rather than asserted on a loaded machine.
Targets: under 10 s, 10 s and 5 s. By hand (two processes with their TF_CONFIG) a killed
worker leaves its peer waiting in the next collective for good: there is no ratio to print.

  python -m benchmarks.bench_launcher_reactions [--rounds 3]
"""

import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app, flags

flags.DEFINE_integer("rounds", 3, "Runs of each reaction.")
FLAGS = flags.FLAGS
REPO = pathlib.Path(__file__).resolve().parent.parent
CONFIG = "cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n"
# Each task joins the cluster, says its pid, and waits as a long training would.
TASK = ("import os, time, tfdist\ntfdist.make_strategy()\n"
        "print('PID', os.getpid(), flush=True)\ntime.sleep(600)\n")


def _start(argv, directory):
  return subprocess.Popen([sys.executable, "-m", "tfdist", *argv], cwd=REPO, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          start_new_session=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})


def _launch(directory):
  config = pathlib.Path(directory) / "config.yaml"
  config.write_text(CONFIG)
  return _start(["launch", str(config), "--logs", str(pathlib.Path(directory) / "logs"),
                 "--verbose", "--", sys.executable, "-c", TASK], directory)


def _pids(process, count):
  pids = []
  for line in process.stdout:
    pids += [int(p) for p in re.findall(r"\] PID (\d+)", line)]
    if len(pids) == count:
      return pids
  raise RuntimeError("the tasks never started")


def _ended(process, started, timeout=120) -> float:
  try:
    process.communicate(timeout=timeout)
  finally:
    if process.poll() is None:
      os.killpg(process.pid, signal.SIGKILL)
  return time.monotonic() - started


def killed_worker(directory) -> float:
  launcher = _launch(directory)
  pids = _pids(launcher, 2)
  os.kill(pids[1], signal.SIGKILL)
  return _ended(launcher, time.monotonic())


def ctrl_c_to_the_launcher(directory) -> float:
  launcher = _launch(directory)
  pids = _pids(launcher, 2)
  started = time.monotonic()
  os.killpg(launcher.pid, signal.SIGINT)
  _ended(launcher, started)
  for pid in pids:  # Every task gone too.
    while _alive(pid):
      time.sleep(0.05)
  return time.monotonic() - started


def ctrl_c_to_tensorboard(directory) -> float:
  server = _start(["tensorboard", str(directory)], directory)
  for line in server.stdout:
    if "http://127.0.0.1:" in line:
      break
  started = time.monotonic()
  os.killpg(server.pid, signal.SIGINT)
  return _ended(server, started)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return True


def main(argv):
  del argv
  reactions = {"worker SIGKILLed -> launcher exits": (killed_worker, 10),
               "Ctrl-C -> every task gone": (ctrl_c_to_the_launcher, 10),
               "Ctrl-C -> tfdist tensorboard exits": (ctrl_c_to_tensorboard, 5)}
  print(f"{'reaction':38} {'median s':>9} {'max s':>7} {'target s':>9}")
  for name, (measure, target) in reactions.items():
    times = []
    for _ in range(FLAGS.rounds):
      with tempfile.TemporaryDirectory() as directory:
        times.append(measure(directory))
    print(f"{name:38} {statistics.median(times):9.2f} {max(times):7.2f} {target:9d}")


if __name__ == "__main__":
  app.run(main)
