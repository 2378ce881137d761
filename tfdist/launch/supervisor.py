"""Starts a `LaunchPlan` and watches it: prefixed output and a plain-text log per task, a
start-up deadline over every peer of the cluster, heartbeats, the first failure (or a frozen
task) as root cause, stopping the rest (SIGTERM, then SIGKILL: MultiWorkerMirrored ignores
SIGTERM), restarts within a budget. Tasks die with the launcher (a parent-death signal), and a
closed terminal (SIGHUP) or stdout does not leave them running.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Sequence, TextIO

from tfdist.errors import ConfigError
from tfdist.launch import decisions, liveness
from tfdist.launch.decisions import (AllDone, Budget, Continue, EvaluatorHung, End, Failed,
                                     FollowRound, GoOnWithout, Grow, HostBack, Left, NewRound,
                                     Preempted, Report, RestartCluster, RestartTask,
                                     StartupTimedOut, State, StopAsked)
from tfdist.launch.hangs import Deadlines, Hang, HangWatch, lost_peers
from tfdist.launch.output import Output, tail
from tfdist.progress import Phase
from tfdist.launch.plan import LaunchPlan, ProcessPlan
from tfdist.exit_codes import PREEMPTED, TASK_FAILED
from tfdist.machine.ports import accepts

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""What stops a launch (and `tfdist tensorboard`): Ctrl-C, a kill, a closed terminal."""
NOTICE_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
"""Forwarded to every task, the launch going on: Slurm's `--signal` before a time limit asks
the tasks to save and exit (`checkpoint.preemption_signal`)."""
_FROZEN_AFTER = 5.0  # A task silent this long when a peer fails is the likelier root cause.
_WAITING_EVERY = 10.0  # Seconds between "waiting for ..." lines at start-up.
_STACKS_WRITTEN = 2.0  # Seconds for the tasks' faulthandler to write their stacks.
_POLL_EVERY = 0.5  # Seconds between a following launcher's polls of the chief's rounds.
_END_SEEN = 1.5  # Seconds the chief's launcher serves its last round before it ends.


@dataclasses.dataclass
class Running:
  plan: ProcessPlan
  process: subprocess.Popen
  pump: threading.Thread


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
  """Runs the plan returned by `make_plan(lost)` (called again for each restart of the whole
  cluster, so new ports can be picked; `lost`: the workers an elastic cluster goes on without).

  Detectors each report an event (`decisions`: a stop signal, the start-up deadline, a
  preemption, a failure or a frozen task, a hang, the end); `decisions.decide` picks the
  action (restart the cluster or a task, go on without a worker, end); the states are
  `decisions.State`: STARTING (servers awaited until `startup_timeout`; heartbeats are not
  judged), RUNNING, STOPPING (a stop signal forwarded, SIGKILL after `grace_period`), ENDED.

  Args:
    make_plan: returns the plan to start, given the workers lost so far.
    startup_timeout: seconds for every task's server to accept connections.
    max_restarts: restarts allowed (of the cluster, or of a failed parameter-server worker).
    grace_period: seconds between SIGTERM and SIGKILL when stopping.
    heartbeat_timeout: seconds without a heartbeat after which a task counts as frozen.
    deadlines: the hang watch's `hangs.Deadlines` (seconds without training progress before
      the task behind is named; by default derived from the run's own times).
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
    rendezvous: a per-host elastic launch's `rendezvous.Host` (this launcher runs the chief:
      it decides the rounds) or `rendezvous.Client` (it follows them); None: this launcher
      decides alone.
  """

  def __init__(self, make_plan: Callable[[], LaunchPlan], *, startup_timeout: float = 120,
               max_restarts: int = 0, grace_period: float = 25, heartbeat_timeout: float = 60,
               deadlines: Deadlines = Deadlines(), verbose: bool = False,
               out: TextIO | None = sys.stdout, on_say: Callable[[str], None] | None = None,
               start_process: Callable[[ProcessPlan], subprocess.Popen] | None = None,
               min_workers: int | None = None,
               on_members: Callable[[int], None] | None = None,
               workers: tuple[str, ...] = (), rendezvous=None):
    from tfdist.launch.backends import local
    self.make_plan = make_plan
    self.start_process = start_process or local.start
    self.startup_timeout = startup_timeout
    self.restarts_left = max_restarts
    self.grace_period = grace_period
    self.heartbeat_timeout = heartbeat_timeout
    self.deadlines = deadlines
    self.verbose = verbose
    self.output = Output(out, on_say)
    self._stop_signal: int | None = None
    self._notices: list[int] = []  # Signals to forward to every task, the launch going on.
    self._running: list[Running] = []
    self._runs_chief = False
    self.min_workers = min_workers
    self.on_members = on_members
    self.state = State.STARTING
    self._lost: tuple[str, ...] = ()  # Workers the cluster went on without (config names).
    self._failures: list[Failed] = []  # Every task failure of the launch, root cause first.
    self.workers = workers
    self.rendezvous = rendezvous
    self._hosts = rendezvous is not None and hasattr(rendezvous, "publish")
    self._round = 0  # The chief's round this launcher runs.
    self._answered = time.monotonic()  # The chief's launcher's last answer to this one.

  # -- output ---------------------------------------------------------------------------------

  def say(self, line: str) -> None:
    self.output.say(line)

  def _peer_failed(self) -> bool:
    """Whether a task of this run failed: what the others print then (their tracebacks of a
    lost peer) goes to their logs only; the root-cause line says what happened."""
    return any(r.process.poll() not in (None, 0, PREEMPTED) for r in list(self._running))

  # -- processes -------------------------------------------------------------------------------

  def _start(self, p: ProcessPlan) -> Running:
    os.makedirs(os.path.dirname(p.log) or ".", exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
      os.remove(dict(p.env).get(liveness.HEARTBEAT_ENV, ""))  # A beat of an earlier start.
    process = self.start_process(p)
    shown = self.verbose or p.chief or not self._runs_chief
    pump = threading.Thread(target=self.output.pump, daemon=True,
                            args=(p.name, process.stdout, p.log, shown, self._peer_failed))
    pump.start()
    self.say(f"{p.name} started (pid {process.pid})")
    return Running(p, process, pump)

  def _stop(self, running: Sequence[Running], signum: int = signal.SIGTERM) -> None:
    """`signum` (SIGTERM) to each process group, SIGKILL to what is left after the grace
    period: a preempted task saves its backup in it."""
    alive = [r for r in running if r.process.poll() is None]
    for r in alive:
      _signal_group(r.process, signum)
    # A cluster none of whose tasks began training (a missing peer, the start-up deadline) has
    # no backup to save: no grace period.
    began = any(_began_training(r) for r in alive if not r.plan.serves)
    deadline = time.monotonic() + (self.grace_period if began else 0)
    for r in alive:
      with contextlib.suppress(subprocess.TimeoutExpired):
        r.process.wait(timeout=max(deadline - time.monotonic(), 0))
    for r in running:
      _signal_group(r.process, signal.SIGKILL)  # Children the task left behind, too.
      r.process.wait()
      r.pump.join(timeout=2)

  # -- the loop -------------------------------------------------------------------------------

  def run(self) -> Outcome:
    previous = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS + NOTICE_SIGNALS}
    try:
      shown = None
      if self.rendezvous is not None and not self._hosts:
        joined = self._join() or self._wait_open()
        if isinstance(joined, End):
          return self._ended(joined)
      while True:
        try:
          plan = self.make_plan(self._lost)
        except ConfigError as e:  # The cluster without its lost workers cannot train.
          return self._ended(End(TASK_FAILED, f"cannot go on without {', '.join(self._lost)}: "
                                              f"{e}"))
        self._runs_chief = any(p.chief for p in plan.processes)
        self._say_plan(plan, shown)
        shown = plan
        self.state, self.output.quiet_until = State.STARTING, 0.0
        self._running = [self._start(p) for p in plan.processes]
        if self.on_members is not None:
          self.on_members(len(self._members()) if self.rendezvous is not None else
                          sum(1 for p in plan.processes if p.task is not None and
                              p.task.type in ("chief", "worker")))
        action = self._watch(plan)
        self._stop(self._running)
        if isinstance(action, Report):
          action = self._await_round(action)
        if isinstance(action, End):
          return self._ended(action)
        self._lost = self._lost_after(action)
        if isinstance(action, FollowRound):
          self._round = action.number
          opened = self._wait_open()
          if isinstance(opened, End):
            return self._ended(opened)
        elif self._hosts and isinstance(opened := self._open_round(), End):
          return self._ended(opened)
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)

  def _say_plan(self, plan: LaunchPlan, shown: LaunchPlan | None) -> None:
    """The whole plan at the first start; at a restart, only what changed."""
    if shown is None:
      self.say(plan.describe())
      if self._runs_chief and not self.verbose and len(plan.processes) > 1:
        self.say("showing the chief's output; every task's is in its log (--verbose shows "
                 "all)")
      return
    if self.rendezvous is not None:  # This host runs one task; the round says who is in.
      gone = [w for w in self.workers if w in self._lost]
      self.say(f"round {self._round}: {', '.join(self._members())}" +
               (f" (without {', '.join(gone)})" if gone else "") +
               f"; this host runs {', '.join(p.name for p in plan.processes)}")
      return
    before = {p.name for p in shown.processes}
    now = [p.name for p in plan.processes]
    gone = sorted(before - set(now))
    self.say(f"the plan again: {', '.join(now)}" + (f" (without {', '.join(gone)})" if gone
                                                    else "") + ", on new ports where picked")

  def _ended(self, action: End) -> Outcome:
    self.state = State.ENDED
    if self._hosts:  # The others end with it: they see the last round, then it is gone.
      self.rendezvous.publish(self._lost, ended=(action.code, action.message))
      time.sleep(_END_SEEN)
    elif self.rendezvous is not None and action.code == 0:
      self.rendezvous.leave(done=True)
    return Outcome(action.code, action.message,
                   self._failures[0].code if self._failures else None, tuple(self._failures))

  def _on_signal(self, signum, frame) -> None:
    del frame
    if signum in NOTICE_SIGNALS:
      self._notices.append(signum)
    else:
      self._stop_signal = signum

  def _budget(self) -> Budget:
    follows = None if self._hosts or self.rendezvous is None else self.rendezvous.name
    anchor = self.rendezvous.name if self._hosts else None
    return Budget(self.restarts_left, self._members(), self.min_workers, self._lost, follows,
                  anchor)

  def _members(self, lost: Sequence[str] | None = None) -> tuple[str, ...]:
    """The configured workers a run has without `lost` (default: this one's), by config
    names."""
    lost = self._lost if lost is None else lost
    return tuple(w for w in self.workers if w not in lost)

  def _config_name(self, name: str) -> str:
    """The config's name of the task a plan calls `name` (workers are renumbered without the
    lost ones)."""
    if not name.startswith("worker-") or not self._lost:
      return name
    return self._members()[int(name.rsplit("-", 1)[1])]

  def _lost_after(self, action) -> tuple[str, ...]:
    if isinstance(action, GoOnWithout):
      return self._lost + action.tasks
    if isinstance(action, Grow):
      return tuple(w for w in self._lost if w not in action.tasks)
    if isinstance(action, FollowRound):
      return action.lost
    return self._lost

  def _watch(self, plan: LaunchPlan) -> decisions.Action:
    """Runs the detectors until one reports an event whose action ends this run of the plan
    (a restart task action is taken here and the watch goes on)."""
    watch = _Watch(plan, self.deadlines)
    while True:
      event = (self._signals() or self._membership(watch) or self._startup(watch) or
               self._failure(watch) or self._hung(watch) or self._done())
      if event is None:
        time.sleep(0.1)
        continue
      action = self._decide(event)
      if isinstance(action, RestartTask):
        self._restart_alone(action.task, watch)
        continue
      if isinstance(action, Continue):
        continue
      if self._hosts and not isinstance(action, End):  # Every launcher starts the new round.
        self._round = self.rendezvous.publish(self._lost_after(action)).number
      return action

  def _decide(self, event) -> decisions.Action:
    """The decision on `event` (the one call of `decisions.decide`), its restarts counted and
    the decision said."""
    action = decisions.decide(event, self._budget())
    if not isinstance(action, End):
      self.restarts_left = action.restarts_left
    self._announce(event, action)
    return action

  # -- detectors: each returns an event, or None ----------------------------------------------

  def _signals(self) -> StopAsked | None:
    """Notices forwarded (the launch goes on); a stop signal forwarded, every task stopped."""
    while self._notices:
      signum = self._notices.pop(0)
      self.say(f"{signal.Signals(signum).name} received: forwarded to every task")
      for r in self._running:
        if r.process.poll() is None:
          _signal_group(r.process, signum)
    if self._stop_signal is None:
      return None
    name = signal.Signals(self._stop_signal).name
    self.state = State.STOPPING
    if self.rendezvous is not None and not self._hosts:
      self.rendezvous.leave()  # Before its task saves with the others: they go on without it.
    self.say(f"{name} received: forwarded to every task, which may save its backup; "
             f"SIGKILL after {self.grace_period:g} s (--grace-period)")
    self._stop(self._running, self._stop_signal)
    saved = all(r.process.poll() == PREEMPTED for r in self._running if not r.plan.serves)
    return StopAsked(name, self._stop_signal, saved)

  def _membership(self, watch: "_Watch") -> Left | HostBack | Failed | Preempted | NewRound | None:
    """The rendezvous: at the chief's launcher, what the others reported, a launcher that left
    or went silent, and one back, taken in once the chief's task begins another epoch; at the
    others', a new round."""
    if self.rendezvous is None:
      return None
    if not self._hosts:
      now = time.monotonic()
      if now - watch.polled < _POLL_EVERY:
        return None
      watch.polled = now
      return self._new_round(self.rendezvous.poll())
    watch.inbox += self.rendezvous.events()
    if watch.inbox:
      event = watch.inbox.pop(0)
      return self._failed(event) if isinstance(event, Failed) else event
    epoch = max((beat.get("epoch", 0) for r in self._trainers()  # Once training runs.
                 for beat in [liveness.read_progress(_heartbeat(r))]
                 if beat and beat.get("phase") != Phase.START.value), default=None)
    if epoch is None:
      return None
    back = []
    for name in self.rendezvous.joined():
      if name not in watch.joined_at:
        watch.joined_at[name] = epoch
        self.say(f"{name}'s launcher is back: it is taken in when an epoch begins")
      elif epoch > watch.joined_at[name]:
        back.append(name)
        watch.joined_at[name] = float("inf")  # Offered once a round.
    return HostBack(tuple(back)) if back else None

  def _new_round(self, found) -> NewRound | None:
    """A round newer than this launcher's, or the end when the chief's launcher stopped
    answering for longer than `heartbeat_timeout`."""
    now = time.monotonic()
    if found is None:
      silent = now - self._answered
      if silent > self.heartbeat_timeout:
        return NewRound(self._round + 1, self._lost, (TASK_FAILED, (
            f"the chief's launcher at {self.rendezvous.address} has not answered for "
            f"{silent:.0f} s")))
      return None
    self._answered = now
    return NewRound(found.number, found.lost, found.ended) if found.number > self._round \
        else None

  def _join(self) -> End | None:
    """A following launcher joins the chief's rounds (the chief's launcher may start after
    it: up to `startup_timeout`); while the round runs without its task (it is back after
    being lost) it waits to be taken in."""
    began, said = time.monotonic(), False
    while True:
      if (stopped := self._leave_if_stopped()) is not None:
        return stopped
      found = self.rendezvous.join()
      if found is None and time.monotonic() - began > self.startup_timeout:
        return End(TASK_FAILED, f"the chief's launcher at {self.rendezvous.address} did not "
                                f"answer in {self.startup_timeout:g} s (--startup-timeout)")
      if found is not None and found.ended is not None:
        return End(*found.ended)
      if found is not None and self.rendezvous.name not in found.lost:
        self._lost, self._round, self._answered = found.lost, found.number, time.monotonic()
        return None
      if found is not None and not said:
        self.say(f"{self.rendezvous.name} joined the chief's launcher at "
                 f"{self.rendezvous.address}; round {found.number} runs without it: waiting "
                 "to be taken in when an epoch begins")
        said = True
      time.sleep(_POLL_EVERY)

  def _wait_open(self) -> End | None:
    """A following launcher's tasks are stopped: it waits until every member's are (the
    round opens), following a newer round, or the end."""
    while True:
      if (stopped := self._leave_if_stopped()) is not None:
        return stopped
      found = self.rendezvous.poll(ready=self._round)
      event = self._new_round(found)
      if event is not None:
        action = self._decide(event)
        if isinstance(action, End):
          return action
        self._lost, self._round = action.lost, action.number
      elif found is not None and found.open:
        return None
      time.sleep(0.2)

  def _open_round(self) -> End | None:
    """The chief's launcher stopped its tasks: it waits until every member's launcher stopped
    its own (the round opens). A member silent meanwhile (its host lost) is decided on at once
    and the round published again without it, never waited on; one alive that does not stop
    its task is waited on for the grace period and the heartbeat timeout, then started."""
    patience = self.grace_period + self.heartbeat_timeout
    deadline = time.monotonic() + patience
    while not self.rendezvous.ready(_POLL_EVERY):
      for event in self.rendezvous.events():
        action = self._decide(self._failed(event) if isinstance(event, Failed) else event)
        if isinstance(action, End):
          return action
        self._lost = self._lost_after(action)
        self._round = self.rendezvous.publish(self._lost).number
      if time.monotonic() > deadline:
        self.say(f"round {self._round}: not every launcher stopped its task in {patience:g} s; "
                 "starting")
        return None
    return None

  def _await_round(self, report: Report):
    """A following launcher reported its task's end; the chief's next round (or end)."""
    self.rendezvous.report(report.event, self._round)
    self.say(f"reported to the chief's launcher at {self.rendezvous.address}; waiting for its "
             "decision")
    self._answered = time.monotonic()
    while True:
      if (stopped := self._leave_if_stopped()) is not None:
        return stopped
      event = self._new_round(self.rendezvous.poll())
      if event is not None:
        return self._decide(event)
      time.sleep(_POLL_EVERY)

  def _leave_if_stopped(self) -> End | None:
    """While a following launcher has no task running: a stop signal ends it, the chief's
    launcher told first."""
    if self._stop_signal is None:
      return None
    self.rendezvous.leave()
    return self._decide(StopAsked(signal.Signals(self._stop_signal).name, self._stop_signal,
                                  False))

  def _startup(self, watch: "_Watch") -> StartupTimedOut | None:
    """The start-up deadline over every task's server; lines while waiting, rejoins, noise."""
    now = time.monotonic()
    watch.waiting = {n: a for n, a in watch.waiting.items() if not accepts(a)}
    names = ", ".join(f"{n} at {a}" for n, a in watch.waiting.items())
    if watch.waiting and now - watch.started > self.startup_timeout:
      self.say(f"start-up deadline: {names} did not come up in {self.startup_timeout:g} s; "
               "stopping every task")
      return StartupTimedOut(names, self.startup_timeout)
    if watch.waiting and now - watch.last_waiting_line >= _WAITING_EVERY:
      watch.last_waiting_line = now
      self.say(f"waiting for {names} ({now - watch.started:.0f} s of "
               f"{self.startup_timeout:g} s)")
    if not watch.waiting:
      self.state = State.RUNNING
    for name, address in list(watch.rejoining.items()):
      if accepts(address):
        self.say(f"{name} is up again at {address}: it rejoined")
        del watch.rejoining[name]
    if sum(self.output.noise.values()) > watch.noise_said:
      watch.noise_said = sum(self.output.noise.values())
      self.say("transient reconnect messages so far (shown in the logs only): " +
               ", ".join(f"{n} {c}" for n, c in sorted(self.output.noise.items())))
    return None

  def _failure(self, watch: "_Watch") -> Preempted | Failed | None:
    """A task that exited non-zero (42: preempted) or froze; the root cause named."""
    # While a server is awaited, the tasks up are connecting their strategy to the cluster,
    # and TensorFlow holds the GIL there: their heartbeat threads stop (a detector test in
    # tests/test_launch_robustness.py fails once it no longer does). The start-up deadline,
    # not the heartbeat, judges that phase.
    starting = bool(watch.waiting)
    frozen = None if starting else self._frozen(self.heartbeat_timeout)
    workers = [r for r in self._running if not r.plan.serves]
    failed = next((r for r in workers if r.process.poll() not in (None, 0)), None)
    failed = failed or next((r for r in self._running if r.plan.serves and
                             r.process.poll() not in (None, 0)), None)
    if failed is not None and failed.process.poll() == PREEMPTED and frozen is None:
      self.say(f"{failed.plan.name} saved its backup after a preemption notice (exit code "
               f"{PREEMPTED}); waiting up to {self.grace_period:g} s for the others")
      self._stop(self._running)
      return Preempted(self._config_name(failed.plan.name))
    if failed is None and frozen is None:
      return None
    cause = (None if starting else self._frozen(_FROZEN_AFTER)) or failed or frozen
    self._report_root_cause(cause, consequence=failed if failed is not cause else None)
    what, detail = _how_it_ended(cause)
    task = cause.plan.task
    return self._failed(Failed(self._config_name(cause.plan.name), cause.process.poll(),
                               f"{what} {detail}",
                               task.type if task else "local",
                               alone=watch.plan.restart_scope != "cluster" and task is not None
                               and task.type == "worker"))

  def _hung(self, watch: "_Watch") -> Failed | EvaluatorHung | None:
    if (hang := self._hang(watch.hangs)) is not None:
      cause = next((r for r in self._running if r.plan.name == hang.behind), None)
      log = f"{cause.plan.log} and its peers'" if cause else "its host's launcher's logs"
      self._name_hang(hang, self._trainers(), "Every task's Python stack (all threads) is in "
                                              f"its log: {log}")
      return self._failed(Failed(self._config_name(hang.behind), None,
                                 f"hung ({hang.waited:.0f} s without progress)", hung=True))
    if (hang := self._hang(watch.evaluator_hangs, evaluator=True)) is not None:
      cause = next(r for r in self._running if r.plan.name == hang.behind)
      self._name_hang(hang, [cause], "Its Python stack (all threads) is in its log: "
                                     f"{cause.plan.log}")
      how = f"hung ({hang.waited:.0f} s without progress)"
      self._failures.append(Failed(hang.behind, None, how, "evaluator", alone=True, hung=True))
      return EvaluatorHung(hang.behind, how)
    return None

  def _done(self) -> AllDone | None:
    # Done: every task running the user's command succeeded; on a host running only servers
    # (a parameter-server cluster's ps and workers), every server ended with 0.
    workers = [r for r in self._running if not r.plan.serves]
    if all(r.process.poll() == 0 for r in workers or self._running):
      return AllDone()
    return None

  def _failed(self, event: Failed) -> Failed:
    self._failures.append(event)
    self.output.quiet_until = float("inf")  # The rest stop: their tracebacks go to the logs only.
    return event

  # -- actions --------------------------------------------------------------------------------

  def _announce(self, event, action) -> None:
    left = f"{self.restarts_left} restart(s) left"
    if isinstance(action, RestartCluster):
      self.say(f"restarting the whole cluster ({left} after this); {action.why}")
    elif isinstance(action, RestartTask):
      again = "; it evaluates the checkpoints again" if isinstance(event, EvaluatorHung) else ""
      self.say(f"restarting {action.task} alone ({left}){again}")
    elif isinstance(action, GoOnWithout):
      remaining = len(self._budget().workers) - len(action.tasks)
      why = (f"left ({event.why})" if isinstance(event, Left) else
             "failed with no restarts left")
      self.say(f"{', '.join(action.tasks)} {why}: going on without it, {remaining} worker(s) "
               f"(--min-workers {self.min_workers}); training resumes from its backup with the "
               "same global batch")
    elif isinstance(action, Grow):
      count = len(self._budget().workers) + len(action.tasks)
      self.say(f"{', '.join(action.tasks)} is back: taking it in as an epoch begins, {count} "
               f"worker(s) ({left}); training resumes from its backup with the same global "
               "batch")
    elif isinstance(action, Continue):
      self.say(action.why)
    elif isinstance(action, FollowRound):
      members = ", ".join(self._members(action.lost))
      self.say(f"the chief's launcher started round {action.number}: {members}")
    elif isinstance(event, AllDone):
      self.say("every task finished: done")
    elif isinstance(event, StopAsked) and event.preempted:
      self.say(f"every task saved its backup: exiting with {PREEMPTED} (restart to resume)")
    elif isinstance(event, NewRound):
      self.say(f"the chief's launcher ended the launch: {action.message}"
               if event.ended else action.message)
    elif isinstance(event, (Failed, EvaluatorHung)) and not isinstance(action, Report):
      self.say("no restarts left (--max-restarts): stopping every task")

  def _restart_alone(self, name: str, watch: "_Watch") -> None:
    cause = next(r for r in self._running if r.plan.name == name)
    self._stop([cause])
    self._running[self._running.index(cause)] = self._start(cause.plan)
    self.output.quiet_until = 0.0  # Its peers went on: their output shows again.
    if cause.plan.address and not (cause.plan.task and cause.plan.task.type == "evaluator"):
      watch.rejoining[name] = cause.plan.address

  def _trainers(self) -> list[Running]:
    """The running tasks whose training progress counts: not servers, not the evaluator."""
    return [r for r in self._running if r.process.poll() is None and not r.plan.serves and
            (r.plan.task is None or r.plan.task.type != "evaluator")]

  def _hang(self, hangs: HangWatch, evaluator: bool = False) -> Hang | None:
    tasks = self._evaluators() if evaluator else self._trainers()
    if not tasks:
      return None
    return hangs.observe(time.monotonic(), {r.plan.name: liveness.read_progress(_heartbeat(r))
                                            for r in tasks})

  def _evaluators(self) -> list[Running]:
    return [r for r in self._running if r.process.poll() is None and r.plan.task is not None
            and r.plan.task.type == "evaluator"]

  def _name_hang(self, hang: Hang, tasks: list[Running], stacks: str) -> None:
    """`tasks`' Python stacks into their logs (faulthandler, registered by `import tfdist` in
    each task; kept off the terminal), then the hang named as the root cause."""
    self.output.quiet_until = time.monotonic() + _STACKS_WRITTEN + 1
    for r in tasks:
      with contextlib.suppress(ProcessLookupError, PermissionError):
        r.process.send_signal(liveness.STACKS_SIGNAL)
    time.sleep(_STACKS_WRITTEN)
    self.say(f"{hang.describe()}: the root cause. {stacks} ({hang.flag} sets the deadline)")

  def _frozen(self, after: float) -> Running | None:
    """The running task silent longest, if its heartbeat is older than `after` seconds."""
    ages = [(age, r) for r in self._running if r.process.poll() is None
            for age in [liveness.heartbeat_age(_heartbeat(r))] if age is not None and age > after]
    return max(ages, key=lambda pair: pair[0])[1] if ages else None

  def _report_root_cause(self, cause: Running, consequence: Running | None = None) -> None:
    cause.pump.join(timeout=0 if cause.process.poll() is None else 2)
    lost = [name for name in lost_peers(tail(cause.plan.log, lines=200), cause.plan.name)
            if name not in {r.plan.name for r in self._running}]
    if lost:  # A peer on another host, lost: the root cause is there, not here.
      what, detail = _how_it_ended(cause)
      self.say(f"{', '.join(lost)} was lost (TensorFlow's coordination service got no "
               f"heartbeats from it: its host, its link or its process is gone): the root "
               f"cause; {cause.plan.name} {what} {detail} because of it. Look at "
               f"{', '.join(lost)}'s host and log. {cause.plan.name}'s log "
               f"({cause.plan.log}) ends:\n" + tail(cause.plan.log))
      return
    what, detail = _how_it_ended(cause)
    then = (f"; {consequence.plan.name} {' '.join(_how_it_ended(consequence))} after it"
            if consequence else "")
    self.say(f"{cause.plan.name} {what} first {detail}: the root cause{then}. Its log "
             f"({cause.plan.log}) ends:\n" + tail(cause.plan.log))


@dataclasses.dataclass
class _Watch:
  """What the detectors keep over one run of a plan."""
  plan: LaunchPlan
  deadlines: dataclasses.InitVar[Deadlines]
  started: float = dataclasses.field(default_factory=time.monotonic)
  last_waiting_line: float = dataclasses.field(default_factory=time.monotonic)
  waiting: dict = dataclasses.field(default_factory=dict)  # Servers not up yet.
  rejoining: dict = dataclasses.field(default_factory=dict)  # Tasks restarted alone.
  noise_said: int = 0
  polled: float = 0.0  # A following launcher's last poll of the rounds.
  inbox: list = dataclasses.field(default_factory=list)  # The rendezvous' events, unread.
  joined_at: dict = dataclasses.field(default_factory=dict)  # Launchers back: the epoch then.

  def __post_init__(self, deadlines: Deadlines) -> None:
    self.waiting = dict(self.plan.peers)  # Every task's server, this host's and its peers'.
    local = {p.name for p in self.plan.processes}
    self.hangs = HangWatch(deadlines, whole_cluster=all(n in local for n, _ in self.plan.peers))
    self.evaluator_hangs = HangWatch(deadlines)  # It runs alone: its own watch.


def _began_training(r: Running) -> bool:
  """Whether task `r` may have trained since it started (its heartbeat): it ran a call of its
  compiled steps, or its input began delivering (the heartbeat thread waits while TensorFlow
  holds the GIL in a first call, so its last beat can say "start" an epoch later: a task
  SIGKILLed on that word lost the save its peers made)."""
  beat = liveness.read_progress(_heartbeat(r))
  return beat is not None and (beat.get("phase") != Phase.START.value or
                               bool(beat.get("drawn")))


def _heartbeat(r: Running) -> str:
  return dict(r.plan.env).get(liveness.HEARTBEAT_ENV, "")


def _how_it_ended(r: Running) -> tuple[str, str]:
  code = r.process.poll()
  if code is None:
    age = liveness.heartbeat_age(_heartbeat(r)) or 0
    return "stopped making progress", f"(no heartbeat for {age:.0f} s, pid {r.process.pid})"
  return "failed", f"(exit code {code})"


def _signal_group(process: subprocess.Popen, signum: int) -> None:
  """`signum` to the process group of a task: its own `signal_group` for a process on another
  machine (`backends.ray.RayProcess`), else this host's `killpg`."""
  with contextlib.suppress(ProcessLookupError, PermissionError):
    if hasattr(process, "signal_group"):
      process.signal_group(signum)
    else:
      os.killpg(process.pid, signum)
