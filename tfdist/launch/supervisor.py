"""Starts a `LaunchPlan` and watches it: prefixed output and a log per task, a start-up
deadline, the first failure as root cause, stopping the rest (SIGTERM, then SIGKILL:
MultiWorkerMirrored ignores SIGTERM), restarts within a budget.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Callable, Sequence, TextIO

from tfdist.config.tf_config import split_address
from tfdist.launch.plan import LaunchPlan, ProcessPlan

# Exit codes of `tfdist launch`.
OK = 0
TASK_FAILED = 1
STARTUP_TIMEOUT = 3
# Stopped by a signal: 128 + its number (130 for SIGINT, 143 for SIGTERM), as shells report.

_TAIL_LINES = 20


@dataclasses.dataclass
class Running:
  plan: ProcessPlan
  process: subprocess.Popen
  pump: threading.Thread


@dataclasses.dataclass(frozen=True)
class Outcome:
  """How a launch ended: the exit code and the one-line reason."""
  code: int
  message: str


class Supervisor:
  """Runs the plan returned by `make_plan()` (called again for each restart of the whole
  cluster, so new ports can be picked).

  Args:
    make_plan: returns the plan to start.
    startup_timeout: seconds for every task's server to accept connections.
    max_restarts: restarts allowed (of the cluster, or of a failed parameter-server worker).
    grace_period: seconds between SIGTERM and SIGKILL when stopping.
    out: where prefixed output and the launcher's messages go.
  """

  def __init__(self, make_plan: Callable[[], LaunchPlan], *, startup_timeout: float = 120,
               max_restarts: int = 0, grace_period: float = 5, out: TextIO = sys.stdout):
    self.make_plan = make_plan
    self.startup_timeout = startup_timeout
    self.restarts_left = max_restarts
    self.grace_period = grace_period
    self.out = out
    self._lock = threading.Lock()
    self._stop_signal: int | None = None
    self._running: list[Running] = []

  # -- output ---------------------------------------------------------------------------------

  def say(self, line: str) -> None:
    with self._lock:
      self.out.write(f"[tfdist launch] {line}\n")
      self.out.flush()

  def _pump(self, name: str, stream, log_path: str) -> None:
    with open(log_path, "ab") as log:
      for raw in iter(stream.readline, b""):
        log.write(raw)
        log.flush()
        with self._lock:
          self.out.write(f"[{name}] {raw.decode(errors='replace')}")
          self.out.flush()

  # -- processes -------------------------------------------------------------------------------

  def _start(self, p: ProcessPlan) -> Running:
    os.makedirs(os.path.dirname(p.log) or ".", exist_ok=True)
    process = subprocess.Popen(p.argv, env={**os.environ, **dict(p.env)},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    pump = threading.Thread(target=self._pump, args=(p.name, process.stdout, p.log), daemon=True)
    pump.start()
    self.say(f"{p.name} started (pid {process.pid})")
    return Running(p, process, pump)

  def _stop(self, running: Sequence[Running]) -> None:
    """SIGTERM to each process group, SIGKILL to what is left after the grace period."""
    alive = [r for r in running if r.process.poll() is None]
    for r in alive:
      _signal_group(r.process, signal.SIGTERM)
    deadline = time.monotonic() + self.grace_period
    for r in alive:
      with contextlib.suppress(subprocess.TimeoutExpired):
        r.process.wait(timeout=max(deadline - time.monotonic(), 0))
    for r in running:
      _signal_group(r.process, signal.SIGKILL)  # Children the task left behind, too.
      r.process.wait()
      r.pump.join(timeout=2)

  # -- the loop -------------------------------------------------------------------------------

  def run(self) -> Outcome:
    previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
      while True:
        plan = self.make_plan()
        self.say(plan.describe())
        self._running = [self._start(p) for p in plan.processes]
        outcome = self._watch(plan)
        self._stop(self._running)
        if outcome is not None:
          return outcome
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)

  def _on_signal(self, signum, frame) -> None:
    del frame
    self._stop_signal = signum

  def _watch(self, plan: LaunchPlan) -> Outcome | None:
    """Watches until the job ends (an Outcome) or the whole cluster must restart (None)."""
    started = time.monotonic()
    waiting = {r.plan.name: r for r in self._running if r.plan.address}
    while True:
      if self._stop_signal is not None:
        name = signal.Signals(self._stop_signal).name
        self.say(f"{name} received: stopping every task")
        return Outcome(128 + self._stop_signal, f"stopped by {name}")
      # Up: its server accepts connections (or it has already exited).
      waiting = {n: r for n, r in waiting.items()
                 if r.process.poll() is None and not _accepts(r.plan.address)}
      if waiting and time.monotonic() - started > self.startup_timeout:
        names = ", ".join(f"{n} ({r.plan.address})" for n, r in waiting.items())
        self.say(f"start-up deadline: {names} did not come up in {self.startup_timeout:g} s; "
                 "stopping every task")
        return Outcome(STARTUP_TIMEOUT, f"{names} did not come up in "
                       f"{self.startup_timeout:g} s")
      workers = [r for r in self._running if not r.plan.serves]
      failed = next((r for r in workers if r.process.poll() not in (None, 0)), None)
      failed = failed or next((r for r in self._running if r.plan.serves and
                               r.process.poll() is not None), None)
      if failed is not None:
        self._report_root_cause(failed)
        if self.restarts_left <= 0:
          self.say("no restarts left (--max-restarts): stopping every task")
          return Outcome(TASK_FAILED,
                         f"{failed.plan.name} exited with {failed.process.returncode}")
        self.restarts_left -= 1
        if plan.restart_scope == "cluster" or failed.plan.task.type != "worker":
          self.say(f"restarting the whole cluster ({self.restarts_left} restart(s) left after "
                   "this); training resumes from its backup")
          return None
        self.say(f"restarting {failed.plan.name} alone ({self.restarts_left} restart(s) left)")
        self._running[self._running.index(failed)] = self._start(failed.plan)
      elif all(r.process.poll() == 0 for r in workers):
        self.say("every task finished: done")
        return Outcome(OK, "done")
      time.sleep(0.1)

  def _report_root_cause(self, failed: Running) -> None:
    failed.pump.join(timeout=2)
    self.say(f"{failed.plan.name} failed first (exit code {failed.process.returncode}): the "
             f"root cause. Its log ({failed.plan.log}) ends:\n" + _tail(failed.plan.log))


def _signal_group(process: subprocess.Popen, signum: int) -> None:
  with contextlib.suppress(ProcessLookupError, PermissionError):
    os.killpg(process.pid, signum)


def _accepts(address: str) -> bool:
  host, port = split_address(address)
  with contextlib.suppress(OSError):
    with socket.create_connection((host.strip("[]"), port), timeout=0.2):
      return True
  return False


def _tail(path: str) -> str:
  try:
    with open(path, errors="replace") as f:
      lines = f.read().splitlines()[-_TAIL_LINES:]
  except OSError:
    lines = ["(no log)"]
  return "\n".join("    " + line for line in lines)
