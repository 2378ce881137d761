"""From a lost worker to training again: a 3-worker local launch (tests/programs/elastic.py)
whose worker-2 fails as epoch 2 begins, timed from the launcher's root-cause line to the
chief's next `EPOCH_BEGIN 2` (the cluster stopped, planned, started, connected, resumed from
its backup). Two ways on: going on with 2 workers (`--min-workers 2`, no restart left) and,
for comparison, restarting the same 3 (`--max-restarts 1`, the worker failing once).

Per-host launches meeting at the chief's launcher (`--rendezvous-port`), one per worker on
127.0.0.1: from worker-2's launcher stopped (SIGTERM), or it and its task killed -9, to the
chief's next epoch with 2, and from the chief's "taking it in" line to worker-2 training again.

A kill -9 on each backend (`benchmarks/recovery.py`): a 2-worker launch, backups every 3
steps, worker-1 killed after step 5 of epoch 3 (on Ray its actor, as when its node is lost):
seconds to training again and steps redone, local and on a Ray head started here (the
`ray` extra).

  python -m benchmarks.bench_elastic [--rounds 2]
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

from absl import app, flags

from benchmarks import recovery

flags.DEFINE_integer("rounds", 2, "Launches of each way; the median is shown.")
FLAGS = flags.FLAGS

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONFIG = ("cluster: {{worker: 3}}\nstrategy: multi_worker_mirrored\n"
           "training: {{global_batch_size: 48, mixed_precision: 'off', steps_per_execution: 1}}\n"
           "checkpoint: {{dir: {dir}}}\n")


def one_launch(drop: bool) -> float:
  """Seconds from the root-cause line to training again, for one launch."""
  with tempfile.TemporaryDirectory() as tmp:
    config = os.path.join(tmp, "config.yaml")
    with open(config, "w") as out:
      out.write(_CONFIG.format(dir=os.path.join(tmp, "checkpoints")))
    marker = os.path.join(tmp, "gone")
    flags_ = ["--min-workers", "2", "--max-restarts", "0"] if drop else ["--max-restarts", "1"]
    env = {**os.environ, "PYTHONPATH": _REPO, "TF_CPP_MIN_LOG_LEVEL": "3", "GONE": "worker-2",
           "MARKER": marker,  # Dropped: gone for good; restarted: it fails once only.
           **({} if drop else {"ONCE": "1"})}
    process = subprocess.Popen(
        [sys.executable, "-m", "tfdist", "launch", config, "--logs", os.path.join(tmp, "logs"),
         "--grace-period", "5", *flags_, "--", sys.executable,
         os.path.join(_REPO, "tests", "programs", "elastic.py")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lost = None
    for line in process.stdout:
      if lost is None and "failed first" in line:
        lost = time.monotonic()
      elif lost is not None and re.search(r"\[worker-0\] EPOCH_BEGIN 2", line):
        seconds = time.monotonic() - lost
        process.wait(300)
        return seconds
    raise RuntimeError("the launch did not train again")


class _Lines:
  """A launcher's output lines, read by a thread, each with the time it was read."""

  def __init__(self, process):
    self.process, self.lines = process, []
    threading.Thread(target=self._read, daemon=True).start()

  def _read(self):
    for line in self.process.stdout:
      self.lines.append((time.monotonic(), line))

  def wait_for(self, pattern: str, after: float = 0, timeout: float = 300) -> float:
    """When the first line matching `pattern` read after `after` was read."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      for at, line in list(self.lines):
        if at > after and re.search(pattern, line):
          return at
      time.sleep(0.05)
    raise RuntimeError(f"no {pattern!r}:\n" + "".join(l for _, l in self.lines[-30:]))


def per_host(killed: bool = False) -> tuple[float, float]:
  """Seconds from a host's launcher stopped (SIGTERM; `killed`: it and its task killed -9, a
  power loss) to the chief training again with 2, and from the chief's taking-in line to the
  host back training, for one run of three per-host launches."""
  from tfdist.machine.ports import free_ports
  with tempfile.TemporaryDirectory() as tmp:
    *ports, rendezvous = free_ports(4)
    config = os.path.join(tmp, "config.yaml")
    with open(config, "w") as out:
      out.write(_CONFIG.replace("{{worker: 3}}", "{{worker: [%s]}}" % ", ".join(
          f'"127.0.0.1:{p}"' for p in ports)).format(dir=os.path.join(tmp, "checkpoints")))
    env = {**os.environ, "PYTHONPATH": _REPO, "TF_CPP_MIN_LOG_LEVEL": "3", "PAUSE": "2",
           "TFDIST_RENDEZVOUS_SECRET": os.urandom(16).hex()}  # Refused without one.

    def host(index):
      return _Lines(subprocess.Popen(
          [sys.executable, "-m", "tfdist", "launch", config, "--task", f"worker:{index}",
           "--logs", os.path.join(tmp, f"logs-{index}-{time.monotonic()}"), "--min-workers",
           "2", "--rendezvous-port", str(rendezvous), "--max-restarts", "2", "--grace-period",
           "15", "--", sys.executable, os.path.join(_REPO, "tests", "programs", "elastic.py")],
          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
    hosts = [host(i) for i in range(3)]
    try:
      hosts[2].wait_for(r"\[worker-2\] EPOCH_BEGIN 1")
      stopped = time.monotonic()
      if killed:
        import psutil
        launcher = psutil.Process(hosts[2].process.pid)
        for process in [launcher, *launcher.children(recursive=True)]:
          process.kill()
      else:
        hosts[2].process.send_signal(signal.SIGTERM)
      going = hosts[0].wait_for(r"going on without it")
      again = hosts[0].wait_for(r"\[worker-0\] EPOCH_BEGIN", after=going) - stopped
      back = host(2)
      hosts.append(back)
      taking = hosts[0].wait_for(r"taking it in as an epoch begins")
      grown = back.wait_for(r"\[worker-2\] EPOCH_BEGIN") - taking
      for h in (hosts[0], hosts[1], back):
        h.process.wait(300)
      return again, grown
    finally:
      for h in hosts:
        if h.process.poll() is None:
          h.process.kill()


def _row(label: str, times) -> str:
  times = sorted(times)
  return f"| {label} | {times[len(times) // 2]:.1f} ({', '.join(f'{t:.1f}' for t in times)}) |"


def main(argv):
  del argv
  rows = ["| after worker-2 is lost | seconds to training again (median) |", "|---|---|"]
  for label, drop in (("go on with 2 (--min-workers 2)", True),
                      ("restart the 3 (--max-restarts 1)", False)):
    rows.append(_row(label, [one_launch(drop) for _ in range(FLAGS.rounds)]))
  runs = [per_host() for _ in range(FLAGS.rounds)]
  rows.append(_row("per host: its launcher stopped, the 2 others training again (its task "
                   "saves with theirs, 15 s grace)", [a for a, _ in runs]))
  rows.append(_row("per host: back, from the chief's taking-in line to it training",
                   [g for _, g in runs]))
  killed = [per_host(killed=True) for _ in range(FLAGS.rounds)]
  rows.append(_row("per host: its launcher and task killed -9, the 2 others training again "
                   "(silence limit 10 s)", [a for a, _ in killed]))
  rows.append(_row("per host: killed -9, back, from the chief's taking-in line to it training",
                   [g for _, g in killed]))
  print("\n".join(rows))
  print("\n| kill -9 of worker-1, backups every 3 steps | seconds to training again | steps "
        "redone |\n|---|---|---|")
  local = [recovery.kill9(3) for _ in range(FLAGS.rounds)]
  own = [recovery.kill9(3, launch_flags=("--preload", "off")) for _ in range(FLAGS.rounds)]
  with recovery.ray_head() as address:
    ray = [recovery.kill9(3, ray_address=address) for _ in range(FLAGS.rounds)]
  for label, runs in (("local", local), ("local, --preload off (each task its own "
                                         "interpreter)", own), ("Ray (its actor killed)", ray)):
    print(f"{_row(label, [s for s, _ in runs])} {', '.join(str(r) for _, r in runs)} |")


if __name__ == "__main__":
  app.run(main)
