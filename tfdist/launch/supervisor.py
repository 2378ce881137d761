"""Starts a `LaunchPlan` and watches it in one loop: the detectors (`detectors.py`) and the
membership (`membership.py`) report events, `decisions.decide` picks each action (its one
call), and the supervisor acts on it: restarts within a budget, going on without a worker,
the end. Tasks die with the launcher (a parent-death signal), and a closed terminal (SIGHUP)
or stdout does not leave them running.
"""

from __future__ import annotations

import collections
import dataclasses
import signal
import sys
import time
from typing import Callable

from tfdist.errors import ConfigError
from tfdist.exit_codes import PREEMPTED, TASK_FAILED
from tfdist.launch import decisions, narration, processes
from tfdist.launch.decisions import (Budget, Continue, EvaluatorHung, End, Failed, FollowRound,
                                     GoOnWithout, Grow, NewRound, Report, RestartCluster,
                                     RestartTask, State, StopAsked)
from tfdist.launch.detectors import Limits, Watch
from tfdist.launch.membership import OPENED, Alone
from tfdist.launch.narration import Members
from tfdist.launch.output import Output
from tfdist.launch.plan import LaunchPlan, ProcessPlan
from tfdist.launch.processes import Running

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What stops a launch (and `tfdist tensorboard`): Ctrl-C, a kill, a closed terminal."""
NOTICE_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
"""Forwarded to every task, the launch going on: Slurm's `--signal` before a time limit asks
the tasks to save and exit (`checkpoint.preemption_signal`)."""


@dataclasses.dataclass(frozen=True)
class Outcome:
  """How a launch ended: the exit code, the one-line reason, after a failure the root cause's
  own exit code (None when it froze or did not fail), and every task failure of the launch,
  root cause first (each restart's, and the workers an elastic cluster went on without)."""
  code: int
  message: str
  root_cause_code: int | None = None
  failures: tuple[Failed, ...] = ()


class Supervisor:
  """Runs the plan returned by `make_plan(lost)` (called again for each start of the cluster,
  so new ports can be picked; `lost`: the workers an elastic cluster goes on without).

  One loop: in each state (`decisions.State`) the detectors and the membership may report an
  event; `decisions.decide` picks the action; the supervisor acts. JOINING: a following
  launcher awaits the round that takes it in; STARTING: every task's server awaited until the
  start-up deadline (heartbeats are not judged); RUNNING; STOPPING: a stop signal forwarded,
  SIGKILL after the grace period; WAITING: this launcher's tasks are stopped, the next round
  awaited (at once when alone); ENDED.

  Args:
    make_plan: returns the plan to start, given the workers lost so far.
    limits: the start-up deadline, heartbeat timeout, grace period and hang deadlines
      (`detectors.Limits`).
    max_restarts: restarts allowed (of the cluster, or of a failed parameter-server worker).
    max_task_restarts: the restarts one task's failures may cause (`--max-restarts-per-task`);
      None: only `max_restarts` counts.
    verbose: show every task's output; by default only the chief's (every worker prints the
      same progress), or every task's when this launcher runs no chief. All go to the logs.
    out: where prefixed output and the launcher's messages go; None, or once it is closed,
      only the log files get output.
    on_say: also called with each of the launcher's own lines (TensorBoard's launcher events).
    start_process: starts a `ProcessPlan` as a `subprocess.Popen` (a backend's `start`); default
      the local backend's.
    min_workers: the fewest workers an elastic cluster goes on with once its restarts are
      spent (`--min-workers`); None: a failure past the restarts ends the launch.
    on_members: also called at each start with the number of training tasks (TensorBoard's
      `launcher/workers`).
    workers: the configured workers' names: `make_plan` is given those lost, by these names.
    membership: `membership.Alone` (default), `Hosting` (this launcher runs the chief and
      keeps a per-host elastic launch's rendezvous) or `Following` (it follows the rounds).
  """

  def __init__(self, make_plan: Callable[[tuple[str, ...]], LaunchPlan], *,
               limits: Limits = Limits(), max_restarts: int = 0,
               max_task_restarts: int | None = None, verbose: bool = False,
               out=sys.stdout, on_say: Callable[[str], None] | None = None,
               start_process: Callable[[ProcessPlan], object] | None = None,
               min_workers: int | None = None, on_members: Callable[[int], None] | None = None,
               workers: tuple[str, ...] = (), membership: Alone | None = None):
    from tfdist.launch.backends import local
    self.make_plan = make_plan
    self.limits = limits
    self.restarts_left = max_restarts
    self.max_task_restarts = max_task_restarts
    self._task_restarts: collections.Counter = collections.Counter()
    self.verbose = verbose
    self.output = Output(out, on_say)
    self.start_process = start_process or local.start
    self.on_members = on_members
    self.members = Members(workers, (), min_workers)
    self.membership = membership or Alone()
    self.membership.say = self.say
    self.state = self.membership.first_state
    self._stop_signal: int | None = None
    self._notices: list[int] = []  # Signals to forward to every task, the launch going on.
    self._running: list[Running] = []
    self._failures: list[Failed] = []  # Every task failure of the launch, root cause first.
    self._shown: LaunchPlan | None = None
    self._watch: Watch | None = None

  def say(self, line: str) -> None:
    self.output.say(line)

  def run(self) -> Outcome:
    """Runs the launch to its end."""
    previous = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS + NOTICE_SIGNALS}
    try:
      while True:
        event = self._next_event()
        if event is OPENED and (cannot := self._start()) is not None:
          return self._ended(cannot)
        if event is None or event is OPENED:
          time.sleep(0.1)
          continue
        if (outcome := self._act(event, self._decide(event))) is not None:
          return outcome
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)

  # -- events -----------------------------------------------------------------------------------

  def _next_event(self):
    """What the detectors of the current state report (or `OPENED`), else None."""
    if (stopped := self._signals()) is not None:
      return stopped
    running = self._running
    if (event := self.membership.poll(self.state, lambda: processes.epoch(running))) is not None:
      return event
    if self.state not in (State.STARTING, State.RUNNING):
      return None
    watch = self._watch
    if (event := watch.startup(running)) is not None:
      return event
    if not watch.waiting:
      self.state = State.RUNNING
    return watch.failure(running) or watch.hung(running) or watch.done(running)

  def _signals(self) -> StopAsked | None:
    """Notices forwarded (the launch goes on); a stop signal forwarded, every task stopped."""
    while self._notices:
      signum = self._notices.pop(0)
      self.say(f"{signal.Signals(signum).name} received: forwarded to every task")
      for r in self._running:
        if r.process.poll() is None:
          processes.signal_group(r.process, signum)
    if self._stop_signal is None or self.state is State.STOPPING:
      return None
    name, running = signal.Signals(self._stop_signal).name, self._running
    self.state = State.STOPPING
    self.membership.leaving()  # A following launcher tells the chief's first.
    if running:
      self.say(f"{name} received: forwarded to every task, which may save its backup; "
               f"SIGKILL after {self.limits.grace_period:g} s (--grace-period)")
      processes.stop(running, self.limits.grace_period, self._stop_signal, asked=True)
    saved = bool(running) and all(r.process.poll() == PREEMPTED for r in running
                                  if not r.plan.serves)
    return StopAsked(name, self._stop_signal, saved)

  def _on_signal(self, signum, frame) -> None:
    del frame
    if signum in NOTICE_SIGNALS:
      self._notices.append(signum)
    else:
      self._stop_signal = signum

  # -- the one decision -------------------------------------------------------------------------

  def _decide(self, event) -> decisions.Action:
    """The decision on `event` (the one call of `decisions.decide`): the failure recorded,
    its restarts counted and the decision said."""
    if isinstance(event, (Failed, EvaluatorHung)):
      self._failures.append(event if isinstance(event, Failed) else
                            Failed(event.task, None, event.how, "evaluator", alone=True,
                                   hung=True))
      if isinstance(event, Failed):
        self.output.quiet_until = float("inf")  # The rest stop: their tracebacks to the logs.
    budget = Budget(
        self.restarts_left, self.members.now(), self.members.min_workers, self.members.lost,
        self.membership.follows, self.membership.anchor, self.state is State.WAITING,
        tuple(self._task_restarts.items()), self.max_task_restarts)
    action = decisions.decide(event, budget)
    spent = isinstance(event, Failed) and budget.task_spent(event.task)
    if not isinstance(action, End):
      self.restarts_left = action.restarts_left
    if isinstance(event, Failed) and isinstance(action, (RestartCluster, RestartTask)):
      self._task_restarts[event.task] += 1
    joined = isinstance(event, NewRound) and self.state is State.JOINING
    if not joined and (line := narration.decision_line(event, action, self.members, spent)):
      self.say(line)
    return action

  def _act(self, event, action) -> Outcome | None:
    """Takes `action`: the outcome when the launch ends, else None."""
    if isinstance(action, End):
      processes.stop(self._running, self.limits.grace_period)
      return self._ended(action)
    if isinstance(action, RestartTask):
      self._restart_alone(action.task)
    elif isinstance(action, Continue):
      pass
    else:  # The tasks stop; the next round is awaited (at once when alone).
      self.members = self._members_after(action)
      if not isinstance(action, Report):  # The others stop theirs as this launcher does.
        self.membership.decided(event, action, self.members.lost)
      processes.stop(self._running, self.limits.grace_period)
      self._running = []
      if isinstance(action, Report):  # Its task's end told once it stopped.
        self.membership.decided(event, action, self.members.lost)
      self.state = State.WAITING
    return None

  def _members_after(self, action) -> Members:
    lost = self.members.lost
    if isinstance(action, GoOnWithout):
      lost = lost + action.tasks
    elif isinstance(action, Grow):
      lost = tuple(w for w in lost if w not in action.tasks)
    elif isinstance(action, FollowRound):
      lost = action.lost
    return Members(self.members.workers, lost, self.members.min_workers)

  # -- processes --------------------------------------------------------------------------------

  def _start(self) -> End | None:
    """Plans the cluster without its lost workers and starts this launcher's tasks; the end
    when the cluster without them cannot train."""
    lost = self.members.lost
    try:
      plan = self.make_plan(lost)
    except ConfigError as e:  # The cluster without its lost workers cannot train.
      return End(TASK_FAILED, f"cannot go on without {', '.join(lost)}: {e}")
    runs_chief = any(p.chief for p in plan.processes)
    for line in narration.plan_lines(plan, self._shown, runs_chief=runs_chief,
                                     verbose=self.verbose, members=self.members,
                                     round_number=self.membership.round):
      self.say(line)
    self._shown = plan
    self.state, self.output.quiet_until = State.STARTING, 0.0
    self._watch = Watch(plan, self.limits, self.output, self._config_name)
    self._running = [self._start_task(p, runs_chief) for p in plan.processes]
    if self.on_members is not None:
      self.on_members(len(self.members.now()) if self.membership.round is not None else
                      sum(1 for p in plan.processes if p.task is not None and
                          p.task.type in ("chief", "worker")))
    return None

  def _start_task(self, p: ProcessPlan, runs_chief: bool) -> Running:
    return processes.start(p, self.start_process, self.output,
                           shown=self.verbose or p.chief or not runs_chief,
                           peer_failed=lambda: processes.failed(self._running))

  def _restart_alone(self, name: str) -> None:
    cause = next(r for r in self._running if r.plan.name == name)
    processes.stop([cause], self.limits.grace_period)
    self._running[self._running.index(cause)] = self._start_task(
        cause.plan, any(r.plan.chief for r in self._running))
    self.output.quiet_until = 0.0  # Its peers went on: their output shows again.
    if cause.plan.address and not (cause.plan.task and cause.plan.task.type == "evaluator"):
      self._watch.rejoining[name] = cause.plan.address

  def _config_name(self, name: str) -> str:
    """The config's name of the task a plan calls `name` (workers are renumbered without the
    lost ones)."""
    if not name.startswith("worker-") or not self.members.lost:
      return name
    return self.members.now()[int(name.rsplit("-", 1)[1])]

  def _ended(self, action: End) -> Outcome:
    self.state = State.ENDED
    self.membership.ended(action.code, action.message, self.members.lost)
    return Outcome(action.code, action.message,
                   self._failures[0].code if self._failures else None, tuple(self._failures))
