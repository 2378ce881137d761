"""A launch's running tasks: started with their output pumped to the terminal and their logs,
stopped (SIGTERM to the process group, SIGKILL after a grace period: MultiWorkerMirrored
ignores SIGTERM), and read (their heartbeat, whether they began training, how they ended).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
import subprocess
import threading
import time
from typing import Callable, Sequence

from tfdist.exit_codes import PREEMPTED
from tfdist.launch import liveness
from tfdist.launch.output import Output
from tfdist.launch.plan import ProcessPlan
from tfdist.progress import Phase


@dataclasses.dataclass
class Running:
  """One started task: its plan, its process (or a backend's Popen-like), its output's pump,
  and when its output ended (monotonic; None while it runs): the nearest the launcher sees
  its exit, whenever its own loop next looks."""
  plan: ProcessPlan
  process: subprocess.Popen
  pump: threading.Thread | None
  ended_at: float | None = None


def start(p: ProcessPlan, start_process: Callable[[ProcessPlan], subprocess.Popen],
          output: Output, shown: bool, peer_failed: Callable[[], bool]) -> Running:
  """Starts `p` (its earlier heartbeat removed), its output pumped into its log and, when
  `shown`, onto the terminal.

  Args:
    p: the task's plan.
    start_process: the backend's `start`.
    output: the launch's terminal.
    shown: whether the task's lines go to the terminal.
    peer_failed: true once a peer failed (the task's lines then go to its log only).

  Returns:
    The `Running` task.
  """
  os.makedirs(os.path.dirname(p.log) or ".", exist_ok=True)
  with contextlib.suppress(FileNotFoundError):
    os.remove(heartbeat(p))  # A beat of an earlier start.
  process = start_process(p)
  running = Running(p, process, None)

  def pump_to_its_end():
    output.pump(p.name, process.stdout, p.log, shown, peer_failed,
                functools.partial(_exit_code, process))
    running.ended_at = time.monotonic()
  running.pump = threading.Thread(target=pump_to_its_end, daemon=True)
  running.pump.start()
  output.say(f"{p.name} started (pid {process.pid})" +
             (f" at {p.address}" if p.address else "") + f", log {p.log}")
  return running


SAME_END_S = 0.2
"""Two outputs ending this close are taken as one moment (twice the supervisor's 0.1 s loop)."""


def first_to_end(tasks: Sequence[Running]) -> Running | None:
  """The task of `tasks` whose output ended first (one still writing, or never pumped, after
  every ended one, in their order): under load the launcher may look only once several have
  exited, and the one that died first is the cause of the others' collective errors."""
  ended = [r.ended_at for r in tasks if r.ended_at is not None]
  if not ended:
    return tasks[0] if tasks else None
  first = min(ended)  # Ends within one look of the launcher's loop: the plan's order then.
  return next(r for r in tasks if r.ended_at is not None and r.ended_at - first <= SAME_END_S)


def _exit_code(process, wait_s: float = 5.0) -> int | None:
  """`process`'s exit code once its output ended (within `wait_s`), None if still running."""
  try:
    return process.wait(timeout=wait_s)
  except subprocess.TimeoutExpired:
    return None


def stop(running: Sequence[Running], grace_period: float, signum: int = signal.SIGTERM,
         asked: bool = False) -> None:
  """`signum` (SIGTERM) to each task's process group, SIGKILL to what is left after
  `grace_period` seconds (a preempted task saves its backup in it). The trainers are signalled
  first and the servers (a parameter-server cluster's worker and ps tasks) once the trainers
  ended: the chief saves its backup from the variables the servers hold and through their
  workers, so a server must outlive it whatever it does with the signal. A cluster none of
  whose tasks began training (a missing peer, the start-up deadline) has no backup to save: no
  grace period, unless the stop was `asked` for (a stop signal to the launcher): then always,
  a heartbeat being no proof that a task has nothing to save."""
  alive = [r for r in running if r.process.poll() is None]
  began = asked or any(began_training(r) for r in alive if not r.plan.serves)
  deadline = time.monotonic() + (grace_period if began else 0)
  for group in ([r for r in alive if not r.plan.serves], [r for r in alive if r.plan.serves]):
    for r in group:
      signal_group(r.process, signum)
    for r in group:
      with contextlib.suppress(subprocess.TimeoutExpired):
        r.process.wait(timeout=max(deadline - time.monotonic(), 0))
  for r in running:
    signal_group(r.process, signal.SIGKILL)  # Children the task left behind, too.
    r.process.wait()
    r.pump.join(timeout=2)


def failed(running: Sequence[Running]) -> bool:
  """Whether a task of `running` exited with neither 0 nor 42 (preempted)."""
  return any(r.process.poll() not in (None, 0, PREEMPTED) for r in list(running))


def trainers(running: Sequence[Running]) -> list[Running]:
  """The running tasks whose training progress counts: not servers, not the evaluator."""
  return [r for r in running if r.process.poll() is None and not r.plan.serves and
          (r.plan.task is None or r.plan.task.type != "evaluator")]


def evaluators(running: Sequence[Running]) -> list[Running]:
  return [r for r in running if r.process.poll() is None and r.plan.task is not None
          and r.plan.task.type == "evaluator"]


def frozen(running: Sequence[Running], after: float) -> Running | None:
  """The running task silent longest, if its heartbeat is older than `after` seconds and it
  did not say it entered a wait that holds the GIL (`progress.HOLDS_THE_GIL`: that wait's own
  deadline judges it)."""
  ages = [(age, r) for r in running if r.process.poll() is None
          for age in [liveness.heartbeat_age(heartbeat(r.plan))] if age is not None and
          age > after and not (liveness.read_progress(heartbeat(r.plan)) or {}).get("gil_held")]
  return max(ages, key=lambda pair: pair[0])[1] if ages else None


def epoch(running: Sequence[Running]) -> float | None:
  """The furthest epoch the training tasks reached, once one trains (None before)."""
  return max((beat.get("epoch", 0) for r in trainers(running)
              for beat in [liveness.read_progress(heartbeat(r.plan))]
              if beat and beat.get("phase") != Phase.START.value), default=None)


def began_training(r: Running) -> bool:
  """Whether task `r` may have trained since it started (its heartbeat): it ran a call of its
  compiled steps, or its input began delivering (the heartbeat thread waits while TensorFlow
  holds the GIL in a first call, so its last beat can say "start" an epoch later: a task
  SIGKILLed on that word lost the save its peers made)."""
  beat = liveness.read_progress(heartbeat(r.plan))
  return beat is not None and (beat.get("phase") != Phase.START.value or
                               bool(beat.get("drawn")))


def heartbeat(p: ProcessPlan) -> str:
  """The path of task `p`'s heartbeat file."""
  return dict(p.env).get(liveness.HEARTBEAT_ENV, "")


def how_it_ended(r: Running) -> tuple[str, str]:
  """("failed", "(exit code N)"), or for a live task that stopped making progress, its
  heartbeat's age and pid."""
  code = r.process.poll()
  if code is None:
    age = liveness.heartbeat_age(heartbeat(r.plan)) or 0
    return "stopped making progress", f"(no heartbeat for {age:.0f} s, pid {r.process.pid})"
  return "failed", f"(exit code {code})"


def signal_group(process: subprocess.Popen, signum: int) -> None:
  """`signum` to the process group of a task: its own `signal_group` for a process on another
  machine (`backends.ray.RayProcess`), else this host's `killpg`."""
  with contextlib.suppress(ProcessLookupError, PermissionError):
    if hasattr(process, "signal_group"):
      process.signal_group(signum)
    else:
      os.killpg(process.pid, signum)
