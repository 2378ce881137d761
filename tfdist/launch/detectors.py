"""What the launcher watches while a plan runs, each detector reporting one `decisions` event or
None: the start-up deadline over every task's server, a task that failed or froze (the root
cause named, with its log's end), a hang (the task behind named, every task's stacks into its
log), every task done. `Watch` keeps what they need over one run of a plan.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Callable

from tfdist.config.schema import DATA_SERVICE_JOBS
from tfdist.exit_codes import PREEMPTED
from tfdist.launch import liveness, processes
from tfdist.launch.decisions import AllDone, EvaluatorHung, Failed, Preempted, StartupTimedOut
from tfdist.launch.hangs import Deadlines, Hang, HangWatch, lost_peers
from tfdist.launch.output import Output, tail
from tfdist.launch.plan import LaunchPlan
from tfdist.launch.processes import Running
from tfdist.machine.ports import accepts

FROZEN_AFTER = 5.0  # A task silent this long when a peer fails is the likelier root cause.
_WAITING_EVERY = 10.0  # Seconds between "waiting for ..." lines at start-up.
_STACKS_WRITTEN = 2.0  # Seconds for the tasks' faulthandler to write their stacks.


@dataclasses.dataclass(frozen=True)
class Limits:
  """The launch's time limits (`tfdist launch`'s flags of the same names)."""
  startup_timeout: float = 120
  heartbeat_timeout: float = 60
  grace_period: float = 25
  deadlines: Deadlines = Deadlines()


@dataclasses.dataclass
class Watch:
  """The detectors over one run of `plan`.

  Args:
    plan: the plan running.
    limits: the launch's time limits.
    output: the launch's terminal.
    config_name: the config's name of a task the plan names (workers are renumbered without
      the lost ones).
  """
  plan: LaunchPlan
  limits: Limits
  output: Output
  config_name: Callable[[str], str]
  started: float = dataclasses.field(default_factory=time.monotonic)
  last_waiting_line: float = dataclasses.field(default_factory=time.monotonic)
  rejoining: dict = dataclasses.field(default_factory=dict)  # Tasks restarted alone.
  noise_said: int = 0

  def __post_init__(self) -> None:
    self.waiting = dict(self.plan.peers)  # Every task's server, this host's and its peers'.
    local = {p.name for p in self.plan.processes}
    self.hangs = HangWatch(self.limits.deadlines,
                           whole_cluster=all(n in local for n, _ in self.plan.peers))
    self.evaluator_hangs = HangWatch(self.limits.deadlines)  # It runs alone: its own watch.

  def startup(self, running: list[Running]) -> StartupTimedOut | None:
    """The start-up deadline over every task's server; lines while waiting, rejoins, noise."""
    now, limit = time.monotonic(), self.limits.startup_timeout
    self.waiting = {n: a for n, a in self.waiting.items() if not accepts(a)}
    names = ", ".join(f"{n} at {a}" for n, a in self.waiting.items())
    if self.waiting and now - self.started > limit:
      self.output.say(f"start-up deadline: {names} did not come up in {limit:g} s; stopping "
                      "every task")
      return StartupTimedOut(names, limit)
    if self.waiting and now - self.last_waiting_line >= _WAITING_EVERY:
      self.last_waiting_line = now
      self.output.say(f"waiting for {names} ({now - self.started:.0f} s of {limit:g} s)")
    for name, address in list(self.rejoining.items()):
      if accepts(address):
        self.output.say(f"{name} is up again at {address}: it rejoined")
        del self.rejoining[name]
    if sum(self.output.noise.values()) > self.noise_said:
      self.noise_said = sum(self.output.noise.values())
      self.output.say("transient reconnect messages so far (shown in the logs only): " +
                      ", ".join(f"{n} {c}" for n, c in sorted(self.output.noise.items())))
    return None

  def failure(self, running: list[Running]) -> Preempted | Failed | None:
    """A task that exited non-zero (42: preempted, the others then given the grace period to
    save) or froze; the root cause named."""
    # While a server is awaited, the tasks up are connecting their strategy to the cluster,
    # and TensorFlow holds the GIL there: their heartbeat threads stop (a detector test in
    # tests/test_launch_robustness.py fails once it no longer does). The start-up deadline,
    # not the heartbeat, judges that phase.
    starting = bool(self.waiting)
    frozen = None if starting else processes.frozen(running, self.limits.heartbeat_timeout)
    failed = processes.first_to_end([r for r in running if not r.plan.serves and
                                     r.process.poll() not in (None, 0)])
    failed = failed or processes.first_to_end([r for r in running if r.plan.serves and
                                               r.process.poll() not in (None, 0)])
    if failed is not None and failed.process.poll() == PREEMPTED and frozen is None:
      self.output.say(f"{failed.plan.name} saved its backup after a preemption notice (exit "
                      f"code {PREEMPTED}); waiting up to {self.limits.grace_period:g} s for "
                      "the others")
      processes.stop(running, self.limits.grace_period)
      return Preempted(self.config_name(failed.plan.name))
    if failed is None and frozen is None:
      return None
    cause = (None if starting else processes.frozen(running, FROZEN_AFTER)) or failed or frozen
    cause = _peer_it_could_not_reach(cause, running)
    self._report_root_cause(cause, running, consequence=failed if failed is not cause else None)
    what, detail = processes.how_it_ended(cause)
    task = cause.plan.task
    return Failed(self.config_name(cause.plan.name), cause.process.poll(), f"{what} {detail}",
                  task.type if task else "local",
                  alone=task is not None and (task.type in DATA_SERVICE_JOBS or (
                      self.plan.restart_scope != "cluster" and task.type == "worker")))

  def hung(self, running: list[Running]) -> Failed | EvaluatorHung | None:
    """A training task behind while its peers wait past the hang deadline (or the evaluator
    without progress), named with every task's stacks written to their logs."""
    if (hang := _hang(self.hangs, processes.trainers(running))) is not None:
      cause = next((r for r in running if r.plan.name == hang.behind), None)
      log = f"{cause.plan.log} and its peers'" if cause else "its host's launcher's logs"
      self._name_hang(hang, processes.trainers(running),
                      f"Every task's Python stack (all threads) is in its log: {log}")
      return Failed(self.config_name(hang.behind), None,
                    f"hung ({hang.waited:.0f} s without progress)", hung=True)
    if (hang := _hang(self.evaluator_hangs, processes.evaluators(running))) is not None:
      cause = next(r for r in running if r.plan.name == hang.behind)
      self._name_hang(hang, [cause], f"Its Python stack (all threads) is in its log: "
                                     f"{cause.plan.log}")
      return EvaluatorHung(hang.behind, f"hung ({hang.waited:.0f} s without progress)")
    return None

  @staticmethod
  def done(running: list[Running]) -> AllDone | None:
    """Every task running the user's command succeeded; on a host running only servers (a
    parameter-server cluster's ps and workers), every server ended with 0."""
    workers = [r for r in running if not r.plan.serves]
    return AllDone() if all(r.process.poll() == 0 for r in workers or running) else None

  def _name_hang(self, hang: Hang, tasks: list[Running], stacks: str) -> None:
    """`tasks`' Python stacks into their logs (faulthandler, registered by `import tfdist` in
    each task; kept off the terminal), then the hang named as the root cause."""
    self.output.quiet_until = time.monotonic() + _STACKS_WRITTEN + 1
    for r in tasks:
      with contextlib.suppress(ProcessLookupError, PermissionError):
        r.process.send_signal(liveness.STACKS_SIGNAL)
    time.sleep(_STACKS_WRITTEN)
    self.output.say(f"{hang.describe()}: the root cause. {stacks} ({hang.flag} sets the "
                    "deadline)")

  def _report_root_cause(self, cause: Running, running: list[Running],
                         consequence: Running | None = None) -> None:
    cause.pump.join(timeout=0 if cause.process.poll() is None else 2)
    what, detail = processes.how_it_ended(cause)
    lost = [name for name in lost_peers(tail(cause.plan.log, lines=200), cause.plan.name)
            if name not in {r.plan.name for r in running}]
    if lost:  # A peer on another host, lost: the root cause is there, not here.
      self.output.say(
          f"{', '.join(lost)} was lost (TensorFlow's coordination service got no heartbeats "
          f"from it, or its server no longer answers: its host, its link or its process is "
          f"gone): the root cause; {cause.plan.name} {what} {detail} because of it (its "
          f"collective's error is in its log, {cause.plan.log}). Look at {', '.join(lost)}'s "
          "host and log")
      return
    then = (f"; {consequence.plan.name} {' '.join(processes.how_it_ended(consequence))} after "
            "it" if consequence else "")
    self.output.say(f"{cause.plan.name} {what} first {detail}: the root cause{then}. Its log "
                    f"({cause.plan.log}) ends:\n" + tail(cause.plan.log))


def _peer_it_could_not_reach(cause: Running, running: list[Running]) -> Running:
  """`cause`, or the task here that its log says it could not reach and that failed too (a
  peer's collective error can be reported before the crash that caused it)."""
  if cause.process.poll() in (None, 0):
    return cause
  named = lost_peers(tail(cause.plan.log, lines=200), cause.plan.name)
  return next((r for r in running if r.plan.name in named and
               r.process.poll() not in (None, 0)), cause)


def _hang(hangs: HangWatch, tasks: list[Running]) -> Hang | None:
  if not tasks:
    return None
  return hangs.observe(time.monotonic(), {r.plan.name: liveness.read_progress(
      processes.heartbeat(r.plan)) for r in tasks})
