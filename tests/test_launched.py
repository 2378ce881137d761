"""What tfdist does to a launched script that trains its own way (tfdist/launched/), and what
the launcher says of how such a script ends: the chief's save ordered before the other
workers' reads of it, a script's own strategy of another kind than the config's refused in one
line, a collective only the chief entered named, a task killed by a signal leaving its
Python stack. Each test failed before its fix (BUILD_NOTES.md, "Scripts with their own
strategy")."""

import keras
import numpy as np
import pytest

from tests.conftest import CONFIGS
from tests.launching import printed, run_launch

pytestmark = pytest.mark.usefixtures("two_cpus")

TWO_WORKERS = "cluster: {worker: 2}\ntraining: {mixed_precision: 'off'}\n"


def test_every_worker_loads_the_chiefs_save_not_a_file_left_before_it(tmp_path):
  """The chief saves 3 s after the others: each worker's load waits for the chief's save of
  its count (twice), its `tf.train.latest_checkpoint` for the chief's checkpoint. Before
  the barrier worker-1 read the stale model at once and found no checkpoint."""
  out = tmp_path / "out"
  out.mkdir()
  stale = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, kernel_initializer="ones")])
  stale.save(out / "model.keras")
  code, output = run_launch(tmp_path, TWO_WORKERS, "save_then_load.py", str(out),
                            env={"CHIEF_DELAY": "3"})
  assert code == 0, output[-3000:]
  logs = sorted((tmp_path / "logs").glob("worker-*.log"))
  seen = printed("".join(log.read_text() for log in logs))
  assert seen["LOADED_1"] == seen["LOADED_2"] == ["True", "True"], output[-3000:]
  assert seen["LATEST"] == ["ckpt-1", "ckpt-1"], output[-3000:]


def test_a_scripts_own_strategy_of_another_kind_is_refused_in_one_line_and_not_restarted(
    tmp_path):
  """Keras's multi-GPU guide (its own `MirroredStrategy()`) launched on the shipped 2-worker
  config: each worker would train alone. Before, worker-0 died of SIGSEGV in
  `MirroredStrategy()` and the launcher showed an empty log."""
  config = (CONFIGS / "multi_worker_mirrored.yaml").read_text().replace("/tmp/tfdist",
                                                                         str(tmp_path))
  (tmp_path / "page").mkdir()
  code, output = run_launch(tmp_path, config, "guides/keras_multi_gpu.py",
                            str(tmp_path / "page"), flags=("--max-restarts", "1"))
  assert code == 2, output[-3000:]
  refusals = [line for line in output.splitlines() if "the script makes tf.distribute." in line]
  assert refusals, output[-3000:]
  assert "is multi_worker_mirrored: 2 workers train together, but the script makes " \
         "tf.distribute.MirroredStrategy, and each worker would train alone" in refusals[0]
  assert "a usage error, which no restart mends: stopping every task" in output, output[-3000:]
  assert "restarting" not in output.lower() and "Traceback" not in output, output[-3000:]


def test_a_collective_only_the_chief_entered_is_named_with_the_task_that_never_did(tmp_path):
  """`if tfdist.is_chief(): model.predict(x)` after fit: worker-1 ends its script while
  worker-0 waits in predict's collective. Before, TensorFlow's DeadlineExceededError after
  120 s, blamed on worker-0."""
  code, output = run_launch(tmp_path, TWO_WORKERS, "chief_only_predict.py",
                            flags=("--hang-timeout", "10"))
  assert code != 0, output[-3000:]
  assert "hang: worker-0 has waited" in output, output[-3000:]
  assert "which worker-1 never entered: it ended training and went on to its script's end. " \
         "A collective called by some workers only" in output, output[-3000:]


@pytest.mark.parametrize("preload", ["auto", "off"])  # Forked from the preload, or started.
@pytest.mark.parametrize("how, shown", [
    ("segv", "in die_here"),  # faulthandler's stack of the task's own code.
    ("silent", "(nothing: the task wrote no output)"),
])
def test_a_task_that_dies_shows_its_stack_or_says_it_wrote_nothing(how, shown, preload,
                                                                   tmp_path):
  """Before, a task killed by SIGSEGV left an empty log, and "Its log ... ends:" showed
  nothing."""
  code, output = run_launch(tmp_path, "cluster: {worker: 1}\n", "signalled.py",
                            flags=("--preload", preload), env={"DIE": how})
  assert code != 0, output[-3000:]
  ends = output.split("ends:", 1)
  assert len(ends) == 2 and shown in ends[1], output[-3000:]
