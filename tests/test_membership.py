"""The membership seam (`tfdist.launch.membership`) and the supervisor's one loop, without a
task process: each kind's events and waits against a real rendezvous over its own HTTP (the
silence judged on a clock the test moves), and the supervisor's states and actions driven by a
scripted membership and tasks that are plain objects."""

import io
import time

import pytest

from tfdist.config.schema import TaskConfig
from tfdist.exit_codes import OK, TASK_FAILED
from tfdist.launch import membership as seam
from tfdist.launch.decisions import (Failed, FollowRound, GoOnWithout, Grow, HostBack, Left,
                                     NewRound, Report, RestartCluster, State)
from tfdist.launch.membership import OPENED, Alone, Following, Hosting
from tfdist.launch.plan import LaunchPlan, ProcessPlan
from tfdist.launch.rendezvous import Client
from tfdist.launch.supervisor import Supervisor
from tfdist.machine.ports import free_ports
from tests.test_rendezvous import WORKERS, clock, host  # noqa: F401 (their fixtures)

def _said(kind):
  lines = []
  kind.say = lines.append
  return lines


def _poll(kind, state, epoch=lambda: None):
  """`kind.poll`, past a following launcher's pause between polls."""
  kind._polled = 0.0
  return kind.poll(state, epoch)


def test_alone_waits_for_no_one():
  alone = Alone()
  assert alone.poll(State.WAITING, lambda: None) is OPENED
  assert alone.poll(State.RUNNING, lambda: None) is None
  assert (alone.follows, alone.anchor, alone.round) == (None, None, None)


def test_hosting_reports_what_members_say_publishes_each_new_round_and_opens_it(host, clock):
  hosting = Hosting(host, patience=60)
  lines = _said(hosting)
  one, two = Client(host.address, "worker-1"), Client(host.address, "worker-2")
  assert hosting.poll(State.WAITING, lambda: None) is OPENED  # The first start waits on no one.
  one.join(), two.join()
  two.report(Failed("worker-2", 1, "failed"), 0)
  assert hosting.poll(State.RUNNING, lambda: None) == Failed("worker-2", 1, "failed")
  action = GoOnWithout(("worker-2",), 0)
  hosting.decided(Failed("worker-2", 1, "failed"), action, ("worker-2",))
  assert hosting.round == 1 and host.round.lost == ("worker-2",)
  assert hosting.poll(State.WAITING, lambda: None) is None  # worker-1 has not stopped its task.
  one.poll(ready=1)
  assert hosting.poll(State.WAITING, lambda: None) is OPENED
  assert hosting.anchor == "worker-0" and hosting.follows is None and lines == []


def test_hosting_never_waits_on_a_member_gone_silent_and_starts_a_stubborn_one(host, clock):
  hosting = Hosting(host, patience=0.3)
  lines = _said(hosting)
  one = Client(host.address, "worker-1")
  hosting.decided(None, RestartCluster(0, "why"), ())
  clock.now += 11  # worker-2 silent past the rendezvous' 10 s since the round's publish.
  one.poll(ready=0)  # worker-1 alive, its task not stopped for round 1.
  left = hosting.poll(State.WAITING, lambda: None)
  assert left == Left(("worker-2",), "its launcher went silent (11 s without a poll: its "
                                     "host is lost)")
  hosting.decided(left, GoOnWithout(left.tasks, 0), left.tasks)
  assert host.round.lost == ("worker-2",)
  assert hosting.poll(State.WAITING, lambda: None) is OPENED  # After 0.5 s of waiting.
  assert lines == ["round 2: not every launcher stopped its task in 0.3 s; starting"]


def test_hosting_takes_a_member_back_once_an_epoch_begins_after_it_joined(host):
  hosting = Hosting(host, patience=60)
  lines = _said(hosting)
  hosting.decided(None, GoOnWithout(("worker-2",), 1), ("worker-2",))
  Client(host.address, "worker-2").join()
  assert hosting.poll(State.RUNNING, lambda: None) is None  # Not training yet.
  assert hosting.poll(State.RUNNING, lambda: 3) is None
  assert lines == ["worker-2's launcher is back: it is taken in when an epoch begins"]
  assert hosting.poll(State.RUNNING, lambda: 3) is None
  assert hosting.poll(State.RUNNING, lambda: 4) == HostBack(("worker-2",))
  assert hosting.poll(State.RUNNING, lambda: 5) is None  # Offered once a round.


class _RayJob:
  """`RayJob.placeable` as a test sets it: the idle bundles Ray placed again."""
  placed = 0

  def placeable(self):
    return self.placed


def test_ray_takes_a_dropped_worker_back_once_a_node_can_run_it_and_an_epoch_began():
  """Ray's membership (`backends.ray.NodeAdded`): nothing while no worker is lost or Ray cannot
  place one; once it can, said, and `HostBack` at the next epoch, for as many as Ray can
  place; a new round resets it."""
  pytest.importorskip("ray", reason="the ray extra is not installed")
  from tfdist.launch.backends.ray import NodeAdded
  job = _RayJob()
  ray = NodeAdded(job, every=0.0)
  lines = _said(ray)
  assert ray.poll(State.WAITING, lambda: None) is OPENED
  job.placed = 1
  assert ray.poll(State.RUNNING, lambda: 1.0) is None  # No worker lost.
  ray.decided(None, GoOnWithout(("worker-1", "worker-2"), 1), ("worker-1", "worker-2"))
  job.placed = 0
  assert ray.poll(State.RUNNING, lambda: 1.0) is None and lines == []
  job.placed = 1
  assert ray.poll(State.STARTING, lambda: 1.0) is None  # Not while the tasks come up.
  assert ray.poll(State.RUNNING, lambda: None) is None  # Nor before an epoch is known.
  assert ray.poll(State.RUNNING, lambda: 1.0) is None
  assert lines == ["Ray can place worker-1 again (a node was added): it is taken in when an "
                   "epoch begins"]
  assert ray.poll(State.RUNNING, lambda: 1.0) is None  # The same epoch.
  assert ray.poll(State.RUNNING, lambda: 2.0) == HostBack(("worker-1",))
  assert ray.poll(State.RUNNING, lambda: 3.0) is None  # Offered once a round.
  ray.decided(None, Grow(("worker-1",), 0), ("worker-2",))
  job.placed = 2
  assert ray.poll(State.RUNNING, lambda: 3.0) is None
  assert ray.poll(State.RUNNING, lambda: 4.0) == HostBack(("worker-2",))


def test_hosting_ends_the_others_with_its_last_round(host):
  hosting = Hosting(host, patience=60)
  follower = Client(host.address, "worker-1")
  hosting.ended(TASK_FAILED, "worker-2 lost", ("worker-2",))
  assert follower.poll().ended == (TASK_FAILED, "worker-2 lost")


def test_following_joins_waits_to_be_taken_in_follows_rounds_and_reports(host):
  following = Following(Client(host.address, "worker-2"), silence=60, join_timeout=60)
  lines = _said(following)
  assert following.first_state is State.JOINING and following.follows == "worker-2"
  host.publish(("worker-2",))  # Back after being lost: the round runs without it.
  assert _poll(following, State.JOINING) is None and _poll(following, State.JOINING) is None
  assert len(lines) == 1 and "waiting to be taken in when an epoch begins" in lines[0]
  host.publish(())
  assert _poll(following, State.JOINING) == NewRound(2, ())
  following.decided(None, FollowRound(2, (), 0), ())
  assert _poll(following, State.WAITING) is None  # The chief's launcher has not stopped.
  host.ready(0)
  Client(host.address, "worker-1").poll(ready=2)
  assert _poll(following, State.WAITING) is OPENED
  failed = Failed("worker-2", 1, "failed (exit code 1)")
  following.decided(failed, Report(failed, 0), ())
  assert host.events() == [Failed("worker-2", 1, "failed (exit code 1)")]
  assert _poll(following, State.WAITING) is None  # Round 2 is open, but not the decision.
  host.publish(())
  assert _poll(following, State.WAITING) == NewRound(3, ())


def test_following_ends_when_the_chiefs_launcher_is_silent_or_never_answers():
  (port,) = free_ports(1)
  following = Following(Client(f"127.0.0.1:{port}", "worker-1"), silence=0.2,
                        join_timeout=0.2)
  time.sleep(0.3)
  event = _poll(following, State.JOINING)
  assert event.ended[0] == TASK_FAILED and "did not answer in 0.2 s" in event.ended[1]
  event = _poll(following, State.RUNNING)
  assert event.ended[0] == TASK_FAILED and "has not answered for" in event.ended[1]


# -- the supervisor's loop, with a scripted membership -----------------------------------------

class Task:
  """A task process that is a plain object: it exits with `code` once asked `polls` times."""

  def __init__(self, code=0, polls=3):
    self.code, self.polls, self.pid, self.stdout = code, polls, 0, io.BytesIO()
    self.signals = []

  def poll(self):
    self.polls -= 1
    return self.code if self.polls < 0 else None

  def wait(self, timeout=None):
    return self.code

  def signal_group(self, signum):  # Never killpg: there is no process group.
    self.signals.append(signum)


class Scripted(Alone):
  """A membership that reports `script`'s events in RUNNING and records what it is told."""

  def __init__(self, script):
    self.script, self.told = list(script), []

  def poll(self, state, epoch):
    if state is State.WAITING:
      return OPENED
    return self.script.pop(0) if state is State.RUNNING and self.script else None

  def decided(self, event, action, lost):
    self.told.append((type(action).__name__, lost))

  def ended(self, code, message, lost):
    self.told.append(("ended", code, lost))


def _plan(tmp_path, lost):
  names = [w for w in WORKERS if w not in lost]
  return LaunchPlan(tuple(
      ProcessPlan(TaskConfig("worker", i), ("python",), (), str(tmp_path / f"{i}.log"), False,
                  None, chief=i == 0) for i in range(len(names))), "cluster")


def test_the_loop_decides_each_event_once_acts_and_goes_through_its_states(tmp_path):
  """A member left: the supervisor decides GoOnWithout, tells the membership the workers lost,
  plans the cluster without them, and ends 0 when the two tasks finish."""
  planned, states = [], []
  scripted = Scripted([Left(("worker-2",), "its launcher was stopped")])
  supervisor = Supervisor(lambda lost: planned.append(lost) or _plan(tmp_path, lost),
                          min_workers=2, workers=WORKERS, out=None, membership=scripted,
                          start_process=lambda p: Task(polls=50))
  observe = supervisor._next_event
  supervisor._next_event = lambda: states.append(supervisor.state) or observe()
  outcome = supervisor.run()
  assert (outcome.code, outcome.message) == (OK, "done")
  assert planned == [(), ("worker-2",)]
  assert scripted.told == [("GoOnWithout", ("worker-2",)), ("ended", OK, ("worker-2",))]
  runs = [s for i, s in enumerate(states) if i == 0 or s is not states[i - 1]]
  assert runs == [State.WAITING, State.STARTING, State.RUNNING] * 2


def test_a_failure_is_recorded_once_and_decide_is_called_in_one_place(tmp_path):
  import ast
  import pathlib
  source = pathlib.Path(seam.__file__).with_name("supervisor.py").read_text()
  calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call) and
           ast.unparse(n.func) == "decisions.decide"]
  assert len(calls) == 1
  supervisor = Supervisor(lambda lost: _plan(tmp_path, lost), workers=WORKERS[:1], out=None,
                          start_process=lambda p: Task(code=3, polls=2))
  outcome = supervisor.run()
  assert outcome.code == TASK_FAILED and outcome.root_cause_code == 3
  assert [f.task for f in outcome.failures] == ["worker-0"]


@pytest.mark.parametrize("action", [RestartCluster(0, "x"), GoOnWithout(("worker-1",), 0),
                                    Grow(("worker-1",), 0)])
def test_each_action_that_changes_who_runs_is_a_new_round(host, action):
  hosting = Hosting(host, patience=60)
  hosting.decided(None, action, ())
  assert host.round.number == 1 and hosting.round == 1


def test_each_decision_that_changes_the_launch_is_said_with_the_members_it_leaves():
  from tfdist.launch.decisions import Continue, End, RestartTask
  from tfdist.launch.narration import Members, decision_line
  members = Members(WORKERS, (), 2)
  failed = Failed("worker-2", 1, "failed (exit code 1)")
  assert decision_line(failed, GoOnWithout(("worker-2",), 0), members).startswith(
      "worker-2 failed with no restarts left: going on without it, 2 worker(s) "
      "(--min-workers 2)")
  assert decision_line(HostBack(("worker-2",)), Grow(("worker-2",), 0), Members(
      WORKERS, ("worker-2",), 2)).startswith("worker-2 is back: taking it in as an epoch "
                                            "begins, 3 worker(s) (0 restart(s) left)")
  assert decision_line(NewRound(4, ("worker-1",)), FollowRound(4, ("worker-1",), 0),
                       members) == "the chief's launcher started round 4: worker-0, worker-2"
  assert decision_line(failed, RestartTask("worker-2", 1), members) == \
      "restarting worker-2 alone (1 restart(s) left)"
  assert decision_line(failed, Continue("nothing to do", 0), members) == "nothing to do"
  # Past --max-restarts-per-task, restarts left to the cluster: said as such.
  assert decision_line(failed, GoOnWithout(("worker-2",), 2), members, spent=True).startswith(
      "worker-2 failed again past --max-restarts-per-task: going on without it, 2 worker(s)")
  assert decision_line(failed, End(1, "worker-2 failed"), members, spent=True) == \
      "worker-2 may cause no more restarts (--max-restarts-per-task): stopping every task"
  assert decision_line(failed, End(1, "worker-2 failed"), members) == \
      "no restarts left (--max-restarts): stopping every task"


def test_the_plan_again_names_the_workers_as_the_config_does_when_one_in_the_middle_is_lost():
  """worker-1 lost of three: the plan's worker-1 is the config's worker-2, and the line says so
  (it said "without worker-2", the plan's numbering, when worker-1 was the one lost)."""
  from tfdist.launch.narration import Members, plan_lines

  def plan(count):
    return LaunchPlan(tuple(ProcessPlan(TaskConfig("worker", i), ("python",), (), f"w{i}.log",
                                        False, f"127.0.0.1:{2000 + i}", i == 0)
                            for i in range(count)), "cluster")
  workers = ("worker-0", "worker-1", "worker-2")
  said = plan_lines(plan(2), plan(3), runs_chief=True, verbose=False,
                    members=Members(workers, ("worker-1",), 2), round_number=None)
  assert said == ["the plan again: worker-0, worker-1 (was worker-2) (without worker-1), on new "
                  "ports where picked"]
  said = plan_lines(plan(2), plan(3), runs_chief=True, verbose=False,
                    members=Members(workers, ("worker-2",), 2), round_number=None)
  assert said == ["the plan again: worker-0, worker-1 (without worker-2), on new ports where "
                  "picked"]
  said = plan_lines(plan(3), plan(2), runs_chief=True, verbose=False,
                    members=Members(workers, (), 2), round_number=None)
  assert said == ["the plan again: worker-0, worker-1, worker-2, on new ports where picked"]
