"""The launcher's one decision (`tfdist.launch.decisions.decide`), case by case, each against
the rule written out here; every event type the module declares has its cases (a new event
without them fails)."""

import typing

import pytest

from tfdist.exit_codes import OK, PREEMPTED, SIGNALLED, STARTUP_TIMEOUT, TASK_FAILED, USAGE
from tfdist.launch import decisions
from tfdist.launch.decisions import (AllDone, Budget, Continue, End, EvaluatorHung, Failed,
                                     FollowRound, GoOnWithout, Grow, HostBack, Left, NewRound,
                                     Preempted, Report, RestartCluster, RestartTask,
                                     StartupTimedOut, StopAsked, decide)

THREE = ("worker-0", "worker-1", "worker-2")
CASES = [
    (StopAsked("SIGINT", 2, preempted=False), Budget(3), End(SIGNALLED + 2, "stopped by SIGINT")),
    (StopAsked("SIGTERM", 15, preempted=True), Budget(3),
     End(PREEMPTED, "preempted by SIGTERM; backups saved")),
    (StartupTimedOut("worker-1 at h:1", 20), Budget(3),
     End(STARTUP_TIMEOUT, "worker-1 at h:1 did not come up in 20 s")),
    (AllDone(), Budget(0), End(OK, "done")),
    (Preempted("worker-0"), Budget(1),
     RestartCluster(0, "training resumes from the step its backup holds")),
    (Preempted("worker-0"), Budget(0), End(PREEMPTED, "worker-0 preempted; backups saved")),
    (EvaluatorHung("evaluator", "hung (40 s without progress)"), Budget(2),
     RestartTask("evaluator", 1)),
    (EvaluatorHung("evaluator", "hung (40 s without progress)"), Budget(0),
     End(TASK_FAILED, "evaluator hung (40 s without progress)")),
    (Failed("worker-1", 1, "failed (exit code 1)"), Budget(2, THREE),
     RestartCluster(1, "training resumes from its backup")),
    (Failed("worker-1", 1, "failed (exit code 1)", alone=True), Budget(2, THREE),
     RestartTask("worker-1", 1)),
    (Failed("worker-1", 1, "failed (exit code 1)"), Budget(0, THREE),
     End(TASK_FAILED, "worker-1 failed (exit code 1)")),
    # Elastic: no restart left, at least the minimum remain: go on without it.
    (Failed("worker-2", 1, "failed (exit code 1)"), Budget(0, THREE, min_workers=2),
     GoOnWithout(("worker-2",), 0)),
    (Failed("worker-1", None, "hung (40 s without progress)", hung=True),
     Budget(0, THREE, min_workers=1), GoOnWithout(("worker-1",), 0)),
    # Restarts come first, elastic or not.
    (Failed("worker-2", 1, "failed (exit code 1)"), Budget(1, THREE, min_workers=2),
     RestartCluster(0, "training resumes from its backup")),
    # Below the minimum: the workers lost named.
    (Failed("worker-1", 1, "failed (exit code 1)"),
     Budget(0, ("worker-0", "worker-1"), min_workers=2, lost=("worker-2",)),
     End(TASK_FAILED, "worker-2, worker-1 lost: 1 worker(s) remain, fewer than "
                      "--min-workers 2")),
    # A chief (not a droppable worker) ends the launch even when elastic.
    (Failed("chief-0", 1, "failed (exit code 1)", task_type="chief"),
     Budget(0, THREE, min_workers=1), End(TASK_FAILED, "chief-0 failed (exit code 1)")),
    # Per-host (the chief's launcher decides): a launcher gone is dropped at once while the
    # minimum remain, taking a restart if one is left; below it, or not elastic, the end.
    (Left(("worker-2",), "its launcher was stopped"), Budget(2, THREE, min_workers=2),
     GoOnWithout(("worker-2",), 1)),
    (Left(("worker-2",), "its launcher was stopped"), Budget(0, THREE, min_workers=2),
     GoOnWithout(("worker-2",), 0)),
    (Left(("worker-1", "worker-2"), "its launcher went silent"), Budget(2, THREE, min_workers=2),
     End(TASK_FAILED, "worker-1, worker-2 left (its launcher went silent)")),
    (Left(("worker-2",), "its launcher was stopped"), Budget(2, THREE),
     End(TASK_FAILED, "worker-2 left (its launcher was stopped)")),
    # The task whose launcher keeps the rendezvous is never dropped.
    (Failed("worker-0", 1, "failed (exit code 1)"), Budget(0, THREE, 2, anchor="worker-0"),
     End(TASK_FAILED, "worker-0 failed (exit code 1)")),
    # A launcher back is taken in with a restart (membership changes count, as in torchrun).
    (HostBack(("worker-2",)), Budget(1, ("worker-0", "worker-1"), 2, ("worker-2",)),
     Grow(("worker-2",), 0)),
    (HostBack(("worker-2",)), Budget(0, ("worker-0", "worker-1"), 2, ("worker-2",)),
     Continue("worker-2 is back; no restarts left (--max-restarts) to take it in", 0)),
    # The others' launchers report to the chief's and follow its rounds.
    (Failed("worker-1", 1, "failed (exit code 1)"), Budget(2, THREE, 2, follows="worker-1"),
     Report(Failed("worker-1", 1, "failed (exit code 1)"), 2)),
    (Preempted("worker-1"), Budget(0, THREE, 2, follows="worker-1"),
     Report(Preempted("worker-1"), 0)),
    (NewRound(3, ("worker-2",)), Budget(1, THREE, 2, follows="worker-1"),
     FollowRound(3, ("worker-2",), 1)),
    (NewRound(3, ("worker-1",)), Budget(1, THREE, 2, follows="worker-1"),
     End(TASK_FAILED, "the cluster went on without worker-1 (round 3)")),
    (NewRound(4, (), (OK, "done")), Budget(1, THREE, 2, follows="worker-1"), End(OK, "done")),
    # A host lost while the round after a restart is being opened (its peers' failure came
    # first) joins that restart: one fault, one restart.
    (Left(("worker-2",), "its launcher went silent"),
     Budget(2, THREE, min_workers=2, between_rounds=True), GoOnWithout(("worker-2",), 2)),
    # A task whose failures caused its share of restarts (--max-restarts-per-task) is treated
    # as with none left: dropped while the minimum remain, else the end; the others' failures
    # still restart.
    (Failed("worker-2", 1, "failed (exit code 1)"),
     Budget(3, THREE, 2, task_restarts=(("worker-2", 1),), max_task_restarts=1),
     GoOnWithout(("worker-2",), 3)),
    (Failed("worker-2", 1, "failed (exit code 1)"),
     Budget(3, THREE, task_restarts=(("worker-2", 1),), max_task_restarts=1),
     End(TASK_FAILED, "worker-2 failed (exit code 1); its failures caused the 1 restart(s) one "
                      "task may cause (--max-restarts-per-task)")),
    (Failed("worker-1", 1, "failed (exit code 1)"),
     Budget(3, THREE, task_restarts=(("worker-2", 1),), max_task_restarts=1),
     RestartCluster(2, "training resumes from its backup")),
    # A role holding no training state is restarted alone from its own 3 restarts, under the
    # default --max-restarts 0; past them, --max-restarts counts.
    (Failed("data_worker-1", -9, "was killed (signal 9)", task_type="data_worker", alone=True),
     Budget(0, THREE), RestartTask("data_worker-1", 0, own=1)),
    (Failed("dispatcher-0", -9, "was killed (signal 9)", task_type="dispatcher", alone=True),
     Budget(0, THREE, task_restarts=(("dispatcher-0", 2),)), RestartTask("dispatcher-0", 0, own=3)),
    (Failed("data_worker-1", 1, "failed (exit code 1)", task_type="data_worker", alone=True),
     Budget(0, THREE, task_restarts=(("data_worker-1", 3),)),
     End(TASK_FAILED, "data_worker-1 failed (exit code 1)")),
    (Failed("data_worker-1", 1, "failed (exit code 1)", task_type="data_worker", alone=True),
     Budget(1, THREE, task_restarts=(("data_worker-1", 3),)), RestartTask("data_worker-1", 0)),
    # A usage error (tfdist refused the task's config or input) ends the launch: no restart
    # would mend it, a stateless role's included.
    (Failed("worker-1", 2, "failed (exit code 2)"), Budget(3, THREE),
     End(USAGE, "worker-1 refused its config or input (exit code 2); a restart would be "
                "refused alike")),
    (Failed("data_worker-0", 2, "failed (exit code 2)", task_type="data_worker", alone=True),
     Budget(3, THREE), End(USAGE, "data_worker-0 refused its config or input (exit code 2); a "
                                  "restart would be refused alike")),
]


@pytest.mark.parametrize("event,budget,expected", CASES)
def test_each_event_gets_the_action_its_rule_says(event, budget, expected):
  assert decide(event, budget) == expected


def test_every_declared_event_has_cases_and_every_action_is_reached():
  events = set(typing.get_args(decisions.Event))
  assert events == {type(event) for event, _, _ in CASES}
  assert set(typing.get_args(decisions.Action)) == {type(action) for _, _, action in CASES}
