"""A hung cluster is named, its stacks kept, and it is restarted (issues 41, 49): the hang watch's
rules as data (`launch/hangs.py`), derived from the code's own phases and collectives
(`tfdist.progress`), then real launches of `tfdist.fit`: a worker blocked in a callback after a
call (one step a call, and the whole epoch a call), in its `from_generator` input and in
`on_epoch_end` is named (not its peer) within its deadline, its stack is in its log, and the
restarted run ends with an uninterrupted run's weights. The other paths: test_hang_paths.py."""

import json

import numpy as np
import pytest

from tfdist import progress
from tfdist.launch.hangs import Deadlines, HangWatch
from tfdist.progress import Collective, Phase
from tests.launching import MWMS_WITH_BACKUP as MWMS, run_launch as _launch
from tests.programs import resumable

pytestmark = pytest.mark.usefixtures("two_cpus")  # In-process references: the suite's devices.


def _p(phase, begun=8, finished=8, where="", *, drawn=8, moves=1, slowest=0.5,
       slowest_epoch_end=1.0, epoch=1, step=3, remote=None):
  return {"phase": phase.value, "where": where, "begun": begun, "finished": finished,
          "drawn": drawn, "moves": moves, "slowest": slowest,
          "slowest_epoch_end": slowest_epoch_end, "epoch": epoch, "step": step,
          "remote": remote or {}}


def _still(watch, tasks, *times):
  """The watch's verdicts on the same progress at `times`."""
  return [watch.observe(t, tasks) for t in times]


# Worker-1 stuck in each phase while worker-0 waits for it in the next call: what the watch
# says, by the code's own list of phases (a new phase without a verdict here fails).
_STUCK_IN = {
    Phase.START: None,  # The start-up deadline's (tracing, connecting).
    Phase.CALL: "hang: worker-1 has been in call 8 for 11 s without progress (epoch 2, after "
                "step 3), while worker-0 waits for it in call 9",
    Phase.COLLECTIVE: "hang: worker-1 has been in the preemption agreement for 11 s without "
                      "progress (epoch 2, after step 3), while worker-0 waits for it in call 9",
    Phase.OWN: "hang: worker-1 has been in on_train_batch_end callbacks for 11 s without "
               "progress (epoch 2, after step 3), while worker-0 waits for it in call 9",
    Phase.EPOCH_END: "hang: worker-1 has been at its epoch's end for 31 s without progress "
                     "(epoch 2, after step 3), while worker-0 waits for it in call 9",
    # Its script's own end, while its peer waits in a call it never entered (a chief-only
    # model.predict after fit): named, the one waiting in the call.
    Phase.DONE: "hang: worker-0 has waited in call 9 for 11 s, which worker-1 never entered: "
                "it ended training and went on to its script's end. A collective called by "
                "some workers only: under a strategy of several workers each one calls Keras's "
                "predict, evaluate and a metric's result (each gets the whole result), not only "
                "the chief",
}
_WHERE = {Phase.CALL: "", Phase.COLLECTIVE: Collective.PREEMPTION_AGREEMENT.value,
          Phase.OWN: "in on_train_batch_end callbacks", Phase.EPOCH_END: "at its epoch's end"}


@pytest.mark.parametrize("phase", list(Phase), ids=lambda p: p.value)
def test_a_task_stuck_in_each_phase_is_named_or_left_to_its_own_deadline(phase):
  assert set(_STUCK_IN) == set(Phase), "a phase without a verdict: add it to _STUCK_IN"
  watch = HangWatch(Deadlines(hang=10, epoch_end=30))
  stuck = _p(phase, 8, 7 if phase == Phase.CALL else 8, _WHERE.get(phase, ""))
  tasks = {"worker-0": _p(Phase.CALL, 9, 8), "worker-1": stuck}
  verdicts = _still(watch, tasks, 0, 9, 11, 31)
  named = next((v for v in verdicts if v is not None), None)
  assert (named and named.describe()) == _STUCK_IN[phase]
  if named:
    assert named.behind == ("worker-0" if phase == Phase.DONE else "worker-1")
    assert named.flag == ("--epoch-end-timeout" if phase == Phase.EPOCH_END else "--hang-timeout")


@pytest.mark.parametrize("collective", list(Collective), ids=lambda c: c.name)
def test_a_task_behind_every_collective_its_peer_waits_in_is_named(collective):
  watch = HangWatch(Deadlines(hang=10))
  tasks = {"worker-0": _p(Phase.COLLECTIVE, where=collective.value),
           "worker-1": _p(Phase.OWN, where="in its own loop (between calls)")}
  hang = next(v for v in _still(watch, tasks, 0, 11) if v is not None)
  assert hang.describe() == (
      "hang: worker-1 has been in its own loop (between calls) for 11 s without progress "
      f"(epoch 2, after step 3), while worker-0 waits for it in {collective.value}")


def test_a_task_whose_input_stopped_is_named_not_its_peer_waiting_in_the_same_call():
  watch = HangWatch(Deadlines(hang=10))
  tasks = {"worker-0": _p(Phase.CALL, 12, 11, drawn=12),
           "worker-1": _p(Phase.CALL, 12, 11, drawn=11)}
  hang = next(v for v in _still(watch, tasks, 0, 11) if v is not None)
  assert hang.describe() == ("hang: worker-1 has been waiting on its input pipeline for 11 s "
                             "without progress (epoch 2, after step 3), while worker-0 waits "
                             "for it in call 12")


def test_a_coordinators_worker_holding_a_call_is_named_not_the_chief():
  watch = HangWatch(Deadlines(hang=10))
  tasks = {"chief-0": _p(Phase.CALL, 20, 19, remote={"0": [11, 11], "1": [9, 8]})}
  hang = next(v for v in _still(watch, tasks, 0, 11) if v is not None)
  assert hang.behind == "worker-1"
  assert hang.describe() == ("hang: worker-1 has been running a call chief-0 scheduled for "
                             "11 s without progress (epoch 2, after step 3), while chief-0 "
                             "waits for it in call 20")


def test_every_task_waiting_in_one_call_is_said_so_here_and_across_hosts():
  tasks = {"worker-0": _p(Phase.CALL, 5, 4), "worker-1": _p(Phase.CALL, 5, 4)}
  here = next(v for v in _still(HangWatch(Deadlines(hang=10)), tasks, 0, 11) if v)
  assert here.every_task_waits and here.describe() == (
      "hang: every task has waited in call 5 for 11 s (epoch 2, after step 3), none behind "
      "another: a collective that never completes")
  alone = {"worker-0": _p(Phase.CALL, 5, 4)}  # A peer on another host: not seen here.
  across = next(v for v in _still(HangWatch(Deadlines(hang=10), whole_cluster=False), alone,
                                  0, 11) if v)
  assert "every task here has waited in call 5" in across.describe()
  assert "a peer on another host never reached it" in across.describe()


def test_progress_and_start_up_keep_the_clock_from_running():
  watch = HangWatch(Deadlines(hang=10))
  moving = [{"worker-0": _p(Phase.CALL, n, n - 1, moves=2 * n),
             "worker-1": _p(Phase.OWN, n - 1, n - 1, moves=2 * n)} for n in range(2, 30)]
  assert all(watch.observe(5 * i, tasks) is None for i, tasks in enumerate(moving))  # Slow.
  tracing = {"worker-0": _p(Phase.CALL, 1, 0), "worker-1": _p(Phase.CALL, 1, 0)}
  assert _still(HangWatch(Deadlines(hang=10)), tracing, 0, 100, 1000) == [None] * 3
  unknown = {"worker-0": _p(Phase.CALL, 5, 4), "worker-1": None}  # Not beating yet.
  assert _still(HangWatch(Deadlines(hang=10)), unknown, 0, 100) == [None] * 2


def test_the_derived_deadlines_are_ten_slowest_phases_with_a_floor():
  deadlines = Deadlines()
  assert deadlines.of(Phase.OWN, {"w": _p(Phase.CALL, slowest=0.5)}) == (60, "--hang-timeout")
  assert deadlines.of(Phase.CALL, {"w": _p(Phase.CALL, slowest=9)})[0] == 90
  assert deadlines.of(Phase.EPOCH_END, {"w": _p(Phase.CALL, slowest_epoch_end=2)}) == \
      (600, "--epoch-end-timeout")
  assert deadlines.of(Phase.EPOCH_END, {"w": _p(Phase.CALL, slowest_epoch_end=90)})[0] == 900


def test_the_recorded_progress_moves_through_the_phases():
  """`tfdist.progress` as a task records it: the phase after each mark, the slowest phase."""
  recorded = progress
  recorded._reset()  # A fresh record: the module is this process's state.
  try:
    assert recorded.snapshot()["phase"] == "start"
    recorded.own_code("in on_epoch_begin callbacks", epoch=0)
    assert recorded.snapshot()["phase"] == "start"  # Until the first call begins.
    recorded.begin_call(0, 0)
    recorded.finish_call(4, "in on_train_batch_end callbacks")
    with recorded.collective(recorded.Collective.PREEMPTION_AGREEMENT):
      assert recorded.snapshot()["where"] == "the preemption agreement"
    seen = recorded.snapshot()
    assert (seen["phase"], seen["where"], seen["begun"], seen["finished"], seen["step"]) == \
        ("own", "in on_train_batch_end callbacks", 1, 1, 4)
    recorded.epoch_end()
    recorded.done()
    assert recorded.snapshot()["phase"] == "done" and recorded.snapshot()["slowest_epoch_end"] >= 0
  finally:
    recorded._reset()




@pytest.fixture(scope="module")
def uninterrupted_weights():
  return [np.asarray(w) for w in resumable.train_plain().get_weights()]


@pytest.fixture(scope="module")
def generator_weights():
  return [np.asarray(w) for w in resumable.train_plain(generator=True).get_weights()]


def _named_stack_kept_and_restart_finished(code, output, tmp_path, where, reference):
  """The launch named worker-1 `where` (not its peer), kept its stack (the blocking function),
  restarted, and ended with `reference`'s weights."""
  assert code == 0, output[-4000:]
  line = next(l for l in output.splitlines() if "hang: " in l)
  assert f"hang: worker-1 has been {where}" in line, line
  assert "while worker-0 waits for it" in line, line
  assert f"in its log: {tmp_path / 'logs' / 'worker-1.log'}" in line, line
  log = (tmp_path / "logs" / "worker-1.log").read_text()
  assert "in block_forever" in log and "Thread 0x" in log, log[-3000:]
  assert "restarting the whole cluster" in output
  assert "  File " not in output.split(line)[1], "a stack on the terminal"  # Logs only.
  weights = json.loads(next(l for l in output.splitlines()
                            if l.startswith("[worker-0] RESULT ")).split("RESULT ", 1)[1])
  for got, want in zip(weights, reference, strict=True):
    np.testing.assert_allclose(got, want, atol=1e-5)


# Worker-1's first attempt blocks for good at each place a user's code can: (HANG_IN, HANG_AT,
# steps per call, where the launcher must say it is). 10 s: under load (a suite beside it) a
# restarted healthy worker's progress was seen 5 s stale while its peer finished.
_PLACEMENTS = {
    # One step a call, mid-epoch: its peer waits in the next call.
    "callback_one_step_a_call": ("batch_end", "1:3", 1, r"in on_train_batch_end callbacks"),
    # The whole epoch one call (the default steps_per_execution, 32, capped to the epoch's 8):
    # its peer waits in Keras's read of the epoch's metrics (it never armed before issue 49).
    "callback_whole_epoch_a_call": ("batch_end", "2:8", 32, r"in on_train_batch_end callbacks"),
    # The generator behind `from_generator`: every task waits in the same call; its input
    # delivered fewer batches.
    "input_generator": ("input", "2:3", 1, r"waiting on its input pipeline"),
    # `on_epoch_end` (a save to a filesystem that never answers): its own deadline.
    "on_epoch_end": ("epoch_end", "2:0", 1, r"at its epoch's end"),
}


@pytest.mark.parametrize("placement", list(_PLACEMENTS))
def test_a_worker_blocked_anywhere_in_fit_is_named_its_stack_kept_and_the_restart_finishes(
    tmp_path, placement, uninterrupted_weights, generator_weights):
  hang_in, at, per_call, where = _PLACEMENTS[placement]
  code, output = _launch(
      tmp_path, MWMS % (tmp_path / "checkpoints"), "resumable.py",
      flags=("--hang-timeout", "10", "--epoch-end-timeout", "10", "--max-restarts", "1"),
      env={"HANG_IN": hang_in, "HANG_AT": at, "STEPS_PER_EXECUTION": str(per_call),
           "HANG_MARKER": str(tmp_path / "hung"), "TMPDIR": str(tmp_path)})
  reference = generator_weights if hang_in == "input" else uninterrupted_weights
  _named_stack_kept_and_restart_finished(code, output, tmp_path, where, reference)
  if hang_in == "epoch_end":
    assert "(--epoch-end-timeout sets the deadline)" in output, output[-4000:]


def test_a_task_alone_stuck_in_its_call_is_named_in_that_call():
  """An evaluator (watched alone) stuck in an evaluation call: it, in its call."""
  tasks = {"evaluator-0": _p(Phase.CALL, 3, 2, "evaluation")}
  hang = next(v for v in _still(HangWatch(Deadlines(hang=10)), tasks, 0, 11) if v)
  assert hang.describe() == ("hang: evaluator-0 has been in call 3 (evaluation) for 11 s "
                             "without progress (epoch 2, after step 3)")
  waiting = {"evaluator-0": _p(Phase.DONE, 3, 3)}  # Waiting for a checkpoint: never named.
  assert _still(HangWatch(Deadlines(hang=10)), waiting, 0, 100, 1000) == [None] * 3
