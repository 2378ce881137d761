"""A hang is named on every path a task trains by (issue 49), in real launches: a worker blocked in
its own `tfdist.TrainingLoop`, a parameter-server worker's step that never ends, a slow but
progressing run never named; and the audit that keeps every collective tfdist runs between calls
declared (`tfdist.progress.Collective`), so a new one cannot escape the watch."""

import json
import re
import warnings

import pytest

from tfdist import progress
from tests.programs import custom_loop
from tests.launching import MWMS_WITH_BACKUP as MWMS, run_launch as _launch

pytestmark = pytest.mark.usefixtures("two_cpus")


def test_a_slow_run_and_a_slow_epoch_end_are_never_named(tmp_path):
  code, output = _launch(
      tmp_path, MWMS % (tmp_path / "checkpoints"), "resumable.py",
      # 20 s: on a loaded machine (a suite beside it) a healthy worker was seen 3 s between
      # two calls; the first epoch's end takes 30 s, longer than that deadline and well within
      # its own.
      flags=("--hang-timeout", "20", "--epoch-end-timeout", "120"),
      # LATE_STACKS: in suites worker-0's end of fit came 40-100 s after its last step (its
      # peer "waited 41 s at its end"); never alone: a late end leaves its threads' stacks.
      env={"STEP_LINES": "1", "SLOW_EPOCH_END": "30", "TMPDIR": str(tmp_path),
           "LATE_STACKS": "15"})
  assert code == 0, output[-4000:]
  assert "hang:" not in output, output[-4000:]
  for log in sorted((tmp_path / "logs").glob("worker-*.log")):  # Shown in the warnings' summary.
    text = log.read_text()
    if "Thread 0x" in text or "NATIVE_STACKS" in text:
      warnings.warn(f"a late end of fit in {log.name}:\n{text[-6000:]}")


def test_a_worker_blocked_in_its_own_loop_is_named_and_the_restart_finishes(tmp_path):
  config = ("cluster: {worker: 2}\ntraining: {global_batch_size: 32, mixed_precision: 'off', "
            f"steps_per_execution: 2}}\ncheckpoint: {{dir: {tmp_path / 'checkpoints'}}}\n")
  code, output = _launch(tmp_path, config, "custom_loop.py", str(tmp_path / "out"),
                         "reduce_mean", flags=("--hang-timeout", "10", "--max-restarts", "1"),
                         env={"HANG_AT": "2:2"})
  assert code == 0, output[-4000:]
  assert "hang: worker-1 has been in its own loop (between calls)" in output, output[-4000:]
  assert "while worker-0 waits for it in call" in output, output[-4000:]
  assert "in block_forever" in (tmp_path / "logs" / "worker-1.log").read_text()
  custom_loop.assert_one_devices_weights(tmp_path / "out" / "result.npz")


def test_a_parameter_server_workers_blocked_step_names_that_worker_not_the_chief(tmp_path):
  """The chief waits on a call scheduled on worker-1, whose step waits on a queue nobody fills:
  worker-1 is named (the coordinator's calls per worker), the cluster restarts and finishes.
  Asynchronous training has no uninterrupted run to equal: the restarted chief resumes its
  backup and trains every epoch."""
  config = ("cluster: {chief: 1, worker: 2, ps: 1}\nstrategy: parameter_server\n"
            "training: {global_batch_size: 32, steps_per_epoch: 30, steps_per_execution: 5, "
            f"epochs: 4, mixed_precision: 'off'}}\ncheckpoint: {{dir: {tmp_path / 'ck'}}}\n")
  code, output = _launch(tmp_path, config, "ps_fit.py",
                         flags=("--hang-timeout", "10", "--max-restarts", "1"),
                         env={"TRAIN_STEP": "guide", "HANG_MARKER": str(tmp_path / "hung"),
                              "PHASE_AUDIT": "1"})
  assert code == 0, output[-4000:]
  chief = (tmp_path / "logs" / "chief-0.log").read_text()
  assert set(re.findall(r"MARKED (\w+)$", chief, re.MULTILINE)) == _PARAMETER_SERVER_MARKS
  line = next(l for l in output.splitlines() if "hang: " in l)
  assert "hang: worker-1 has been running a call chief-0 scheduled for" in line, line
  assert "while chief-0 waits for it in call" in line, line
  assert f"in its log: {tmp_path / 'logs' / 'worker-1.log'}" in line, line
  assert "restarting the whole cluster" in output
  result = json.loads(output.split("] RESULT ", 1)[1].splitlines()[0])
  assert result["epochs"][-1] == 3, result  # Resumed, and trained to its last epoch.


def test_the_coordinator_still_runs_each_call_in_worker_process_closure():
  """The detector behind naming a parameter-server worker (`parameter_server.
  coordinator_recording_progress`): TensorFlow's coordinator runs each scheduled call in its
  worker thread's `Worker._process_closure`. When this fails, that seam moved."""
  import inspect
  from tensorflow.python.distribute.coordinator import cluster_coordinator
  worker = cluster_coordinator.Worker
  assert "self._process_closure(closure)" in inspect.getsource(worker._process_queue)
  assert "worker_index" in inspect.signature(worker.__init__).parameters


# Each training path with every collective tfdist runs between its calls switched on: the
# preemption agreement (checkpoint.dir), the step backups' agreement (backup_every_steps), the
# step times' gather (tensorboard.log_dir), the shards' gather at each backup,
# evaluation (validation_data), periodic averaging;
# the loop reads through the tf.data service (a dataset's run name agreed as it is first read);
# with the recorded functions each path must be seen running (any phase) and the collectives it
# must enter.
_AUDITED = {
    "fit": ("backup_every_steps: 2",
            "training: {global_batch_size: 32, zero_stage: 1, steps_per_execution: 2}\n"
            "tensorboard: {log_dir: %(tmp)s/tb}\n", {},
            {"compiled function", "all_reduce_v2", "all_gather_v2"},
            {"KERAS_LOOP", "PREEMPTION_AGREEMENT", "BACKUP_AGREEMENT", "STEP_TIMES",
             "SHARDED_GATHER", "EXIT_BARRIER"}),
    # Its step backups each taken (no budget): their copy runs between calls.
    "training_loop": ("backup_every_steps: 2, backup_budget: null",
                      "training: {global_batch_size: 32, steps_per_execution: 2, "
                      "average_every: 3}\n", {"LOOP": "1"},
                      {"compiled function", "all_reduce_v2"},
                      {"PREEMPTION_AGREEMENT", "BACKUP_AGREEMENT", "PERIODIC_AVERAGING",
                       "DATA_SERVICE_NAME", "EXIT_BARRIER"}),
}
# Entered by the parameter-server test above (its chief prints them: ps_fit.py, PHASE_AUDIT).
_PARAMETER_SERVER_MARKS = {"COORDINATOR_JOIN", "KERAS_LOOP"}


def test_every_collective_is_entered_by_some_audited_run():
  """A declared collective no run enters is a place the watch no longer sees (or a
  declaration to remove)."""
  entered = set().union(*(marks for *_, marks in _AUDITED.values()), _PARAMETER_SERVER_MARKS)
  assert entered == {c.name for c in progress.Collective}, entered ^ {
      c.name for c in progress.Collective}


@pytest.mark.parametrize("path", list(_AUDITED))
def test_every_collective_tfdist_runs_between_calls_is_declared_where_it_runs(tmp_path, path):
  """No compiled function, eager collective or barrier that tfdist's code runs while the task
  records its own code (a callback, an epoch's end): there a task waiting for its peers would
  be taken for the one they wait for. A new collective fails this until it is marked
  (`progress.collective`); the recording is shown to see the path's collectives, and the
  marks the path must enter are entered."""
  backups, extra, env, ran, marks = _AUDITED[path]
  config = (MWMS % f"{tmp_path / 'checkpoints'}, {backups}") + extra % {"tmp": tmp_path}
  if "DATA_SERVICE_NAME" in marks:
    config = config.replace("{worker: 2}", "{worker: 2, dispatcher: 1, data_worker: 1}")
  code, output = _launch(tmp_path, config, "phase_audit.py", env=env)
  assert code == 0, output[-4000:]
  for task in ("worker-0", "worker-1"):
    log = (tmp_path / "logs" / f"{task}.log").read_text()
    audit = json.loads(log.split("AUDIT ", 1)[1].splitlines()[0])
    assert audit == [], f"{task}: {audit[:5]}"
    calls = json.loads(log.split("CALLS ", 1)[1].splitlines()[0])
    assert ran <= {kind for kind, count in calls.items() if count}, (task, calls)
    marked = set(re.findall(r"MARKED (\w+)$", log, re.MULTILINE))
    assert marked == marks, (task, marked)


def test_an_evaluator_stuck_in_its_evaluation_is_named_and_restarted_alone(tmp_path):
  """The evaluator runs alone (it waits for checkpoints, legitimately, and on no peer): its
  own evaluation stuck in its input is named, its stack kept, and it restarts alone and
  evaluates every checkpoint."""
  config = ("cluster: {worker: 1, evaluator: 1}\n"
            f"checkpoint: {{dir: {tmp_path / 'checkpoints'}}}\n")
  code, output = _launch(tmp_path, config, "evaluated.py",
                         flags=("--hang-timeout", "8", "--max-restarts", "1", "--verbose"),
                         env={"HANG_MARKER": str(tmp_path / "hung")})
  assert code == 0, output[-4000:]
  line = next(l for l in output.splitlines() if "hang: " in l)
  assert "hang: evaluator-0 has been in call" in line and "(evaluation)" in line, line
  assert "restarting evaluator-0 alone" in output, output[-4000:]
  assert "in block_forever" in (tmp_path / "logs" / "evaluator-0.log").read_text()
  assert "[evaluator-0] EVALUATED [0, 1, 2]" in output, output[-4000:]
