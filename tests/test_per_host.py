"""One task per `tfdist launch --task`, as on real hosts (here all on 127.0.0.1): a
parameter-server cluster whose ps and workers serve until the chief is done, then end with 0."""

import sys

from tfdist.machine.ports import HeldPorts
from tests.conftest import PROGRAMS
from tests.launching import finish, start_launch


def test_per_host_parameter_server_launches_train_and_all_end_by_themselves(write_config,
                                                                          tmp_path):
  held = HeldPorts(4)  # Bound, never listening, until the test ends: no other test takes them.
  chief, w0, w1, ps = (f"127.0.0.1:{p}" for p in held.ports)
  path = write_config(
      f'cluster: {{chief: ["{chief}"], worker: ["{w0}", "{w1}"], ps: ["{ps}"]}}\n'
      "strategy: parameter_server\n"
      "training: {global_batch_size: 64, epochs: 3, steps_per_epoch: 16, steps_per_execution: 4,"
      " mixed_precision: off}\n")
  launchers = {task: start_launch(str(path), "--task", task, "--logs", str(tmp_path / task),
                                  "--", sys.executable, str(PROGRAMS / "user_script.py"),
                                  str(tmp_path / "out"), "dataset")
               for task in ("ps:0", "worker:0", "worker:1", "chief:0")}
  try:
    outputs = {task: finish(process, 180, []) for task, process in launchers.items()}
  finally:
    held.close()
  for task, process in launchers.items():
    assert process.returncode == 0, f"{task}:\n{outputs[task][-3000:]}"
  assert "final loss" in outputs["chief:0"]
  for server in ("ps:0", "worker:0", "worker:1"):
    assert "is gone for 30 s: the job is done; stopping" in outputs[server]
    assert "every task finished: done" in outputs[server]
