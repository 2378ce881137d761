"""The guides, whole pages: each page of TensorFlow's and Keras's distributed-training guides,
written as a program from its structure (tests/programs/guides/), runs unchanged under
`tfdist launch` on the config its page implies, a shipped one (configs/), and equals the same
program run plainly: on one device (plain TensorFlow without a strategy, the launch's global
batch: `tests/plain.py`) where tfdist promises one device's results, or plain
TensorFlow's own (its logical devices, its hand-set TF_CONFIG) where the page itself differs
from one device. What each page's result equals is docs/how-to/from-your-script.md's table."""

import dataclasses
import json
import math
import pathlib
import sys

import keras
import numpy as np
import pytest

from tfdist.config.schema import ClusterConfig, TaskConfig
from tfdist.testing import forked, local_cluster
from tests.conftest import CONFIGS, PROGRAMS, REPO
from tests.launching import ENV, run_launch

GUIDES = PROGRAMS / "guides"
TOLERANCE = 1e-5  # Measured: every page within 5e-7 of its reference (BUILD_NOTES.md).


def results(output: str, prefix: str = "") -> dict:
  """{section: value} of a program's `RESULT <section> <json>` lines (`prefix`: a task's)."""
  found = {}
  for line in output.splitlines():
    if line.startswith(prefix + "RESULT "):
      _, section, text = line[len(prefix):].split(" ", 2)
      found[section] = json.loads(text)
  return found


def assert_same(got, want, where: str = "") -> None:
  """Numbers within `TOLERANCE`, everything else exactly, structure alike."""
  if isinstance(want, dict):
    assert sorted(got) == sorted(want), where
    for key in want:
      assert_same(got[key], want[key], f"{where}.{key}")
  elif isinstance(want, list) and want and not _numeric(want):
    assert len(got) == len(want), where
    for i, (g, w) in enumerate(zip(got, want)):
      assert_same(g, w, f"{where}[{i}]")
  elif _numeric(want):
    np.testing.assert_allclose(np.asarray(got, dtype=float), np.asarray(want, dtype=float),
                               atol=TOLERANCE, err_msg=where)
  else:
    assert got == want, where


def _number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _numeric(value) -> bool:
  """A number, or a flat list of numbers (nested lists are compared element by element)."""
  return _number(value) or (isinstance(value, list) and bool(value) and
                            all(_number(v) for v in value))


def shipped(name: str, workdir: pathlib.Path) -> str:
  """A shipped config's text, its folders under `workdir` (every test its own)."""
  return (CONFIGS / name).read_text().replace("/tmp/tfdist", str(workdir))


def one_device(program: str, args, *, replicas: int, workers: int = 0) -> dict:
  """`program` run on one device by plain TensorFlow (`tests/plain.py`), telling it
  `replicas` replicas; a multi-worker page reads a TF_CONFIG of `workers` workers (no server is
  started: no strategy reads it)."""
  env = {k: v for k, v in ENV.items() if not k.startswith("TFDIST")}
  if workers:
    env["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{i + 1}" for i in
                                                          range(workers)]},
                                   "task": {"type": "worker", "index": 0}})
  done = forked.run([sys.executable, "-m", "tests.plain", "one_device", str(replicas),
                     str(GUIDES / program), *map(str, args)], env=env, cwd=REPO, timeout=240)
  assert done.returncode == 0, done.stderr[-3000:]
  return results(done.stdout)


def plainly(program: str, args) -> dict:
  """`program` run by plain TensorFlow as it is (a page making its own devices)."""
  env = {k: v for k, v in ENV.items() if not k.startswith("TFDIST")}
  done = forked.run([sys.executable, str(GUIDES / program), *map(str, args)], env=env, cwd=REPO,
                    timeout=240)
  assert done.returncode == 0, done.stderr[-3000:]
  return results(done.stdout)


def launched(tmp_path, config_text: str, program: str, args, prefix: str) -> tuple[str, dict]:
  code, output = run_launch(tmp_path, config_text, f"guides/{program}", *map(str, args))
  assert code == 0, output[-4000:]
  return output, results(output, prefix)


@dataclasses.dataclass(frozen=True)
class Page:
  """One guide's program: the shipped config its page implies, the task whose output is
  compared, and its reference (`one_device` at the launch's replicas, or `plainly`)."""
  program: str
  config: str
  task: str
  reference: str = "one_device"
  workdir: bool = True
  workers: int = 0


PAGES = {
    "multi_worker_with_keras": Page("tf_multi_worker_keras.py", "multi_worker_mirrored.yaml",
                                    "worker-0", workers=2),
    "multi_worker_with_ctl": Page("tf_multi_worker_ctl.py", "multi_worker_mirrored.yaml",
                                  "worker-0", workers=2),
    "distributed_training_with_keras": Page("tf_keras_mirrored.py", "mirrored.yaml", "local"),
    "custom_training": Page("tf_custom_training.py", "mirrored.yaml", "local"),
    "save_and_load": Page("tf_save_and_load.py", "mirrored.yaml", "local"),
    # The page makes its own two logical CPUs: plain TensorFlow's own replicas.
    "distributed_input": Page("tf_distributed_input.py", "mirrored.yaml", "local",
                              reference="plainly", workdir=False),
    "keras_multi_gpu": Page("keras_multi_gpu.py", "mirrored.yaml", "local"),
}


@pytest.mark.parametrize("name", PAGES)
def test_a_guides_whole_page_runs_unchanged_under_the_launcher_as_its_reference(name, tmp_path):
  page = PAGES[name]
  run, ref = tmp_path / "run", tmp_path / "reference"
  (run / "page").mkdir(parents=True), ref.mkdir()
  args = (lambda d: [d] if page.workdir else [])
  output, got = launched(run, shipped(page.config, tmp_path / "shipped"), page.program,
                         args(run / "page"), f"[{page.task}] ")
  want = (one_device(page.program, args(ref), replicas=2, workers=page.workers)
          if page.reference == "one_device" else plainly(page.program, args(ref)))
  assert want and got.keys() == want.keys(), (sorted(want), output[-3000:])
  for section in want:
    assert_same(got[section], want[section], section)
  # What tfdist did to the script, said once, by the chief.
  said = [line for line in output.splitlines() if "tfdist: the script's own" in line]
  assert len(said) == 1 and said[0].startswith(f"[{page.task}] "), said


def test_the_multi_worker_page_writes_the_chiefs_files_alone(tmp_path):
  """Its BackupAndRestore sections leave no backup behind (Keras deletes it at the end) and
  no other worker's folder; its checkpoint section's `write_filepath` leaves the page's
  emptied `workertemp_1` (as plain TensorFlow's run leaves it)."""
  run = tmp_path / "run"
  (run / "page").mkdir(parents=True)
  launched(run, shipped("multi_worker_mirrored.yaml", tmp_path / "shipped"),
           "tf_multi_worker_keras.py", [run / "page"], "[worker-0] ")
  written = sorted(str(p.relative_to(run / "page")) for p in (run / "page").rglob("*"))
  assert written == ["ckpt", "ckpt/checkpoint", "ckpt/ckpt-1.data-00000-of-00001",
                     "ckpt/ckpt-1.index", "keras-model.keras", "workertemp_1"], written


def test_keras_multi_gpu_guides_uneven_last_batch_equals_plain_tensorflows_replicas(tmp_path):
  """1,301 rows leave a last global batch of 21, split 11 and 10: Keras weighs each replica's
  mean alike, so two replicas are not one device (1.1e-3 in 2 epochs, measured) in plain
  TensorFlow's own MirroredStrategy either; tfdist gives plain TensorFlow's numbers."""
  run, ref = tmp_path / "run", tmp_path / "reference"
  (run / "page").mkdir(parents=True), ref.mkdir()
  _, got = launched(run, shipped("mirrored.yaml", tmp_path / "shipped"), "keras_multi_gpu.py",
                    [run / "page", 1301], "[local] ")
  env = {k: v for k, v in ENV.items() if not k.startswith("TFDIST")}
  done = forked.run([sys.executable, "-m", "tests.plain", "cpus", "2",
                     str(GUIDES / "keras_multi_gpu.py"), str(ref), "1301"], env=env, cwd=REPO,
                    timeout=240)
  assert done.returncode == 0, done.stderr[-3000:]
  want = results(done.stdout)
  for section in ("fit", "evaluate", "first_run", "second_run", "weights"):
    assert_same(got[section], want[section], section)
  (tmp_path / "one").mkdir()
  far = one_device("keras_multi_gpu.py", [tmp_path / "one", 1301], replicas=2)
  gap = max(abs(a - b) for a, b in zip([*got["fit"]["loss"], *got["evaluate"]],
                                       [*far["fit"]["loss"], *far["evaluate"]]))
  assert gap > 10 * TOLERANCE, gap  # The page itself differs from one device here.


# The parameter-server page: its Model.fit section runs tfdist's coordinator loop (Keras 3 has
# none: plain TensorFlow fails there), its custom loop as plain TensorFlow runs it.
PS_ONE_WORKER = "cluster: {chief: 1, worker: 1, ps: 1}\nstrategy: parameter_server\n"


def _plain_parameter_server_loop(tmp_path) -> dict:
  """The page's custom-loop section, plain TensorFlow: the program as every task of a cluster
  of a chief, a worker and a ps (the page's "same binary"), each with its own TF_CONFIG."""
  tmp_path.mkdir()
  cluster = local_cluster.local_cluster(ClusterConfig(chief=1, worker=1, ps=1))
  env = {k: v for k, v in ENV.items() if not k.startswith("TFDIST")}
  argv = [sys.executable, str(GUIDES / "tf_parameter_server.py"), str(tmp_path), "loop"]
  servers = [local_cluster.start_task(TaskConfig(kind, 0), argv, cluster, tmp_path, env=env)
             for kind in ("worker", "ps")]
  with local_cluster.running(servers):
    chief = local_cluster.start_task(TaskConfig("chief", 0), argv, cluster, tmp_path, env=env)
    with local_cluster.running([chief]):
      local_cluster.wait([chief], 240)
  assert chief.process.returncode == 0, chief.output()[-3000:]
  return results(chief.output())


def _one_device_model_fit() -> dict:
  """The page's Model.fit section on one device, plain Keras: the same seeded data, model,
  optimizer, loss and steps, the model built on a batch first (plain Keras refuses
  BackupAndRestore on an unbuilt model), no strategy."""
  program = PROGRAMS / "guides" / "tf_parameter_server_one_device.py"
  env = {k: v for k, v in ENV.items() if not k.startswith("TFDIST")}
  done = forked.run([sys.executable, str(program)], env=env, cwd=REPO, timeout=240)
  assert done.returncode == 0, done.stderr[-3000:]
  return results(done.stdout)


def test_the_parameter_server_page_with_one_worker_equals_one_device_and_plain_tensorflow(
    tmp_path):
  run = tmp_path / "run"
  (run / "page").mkdir(parents=True)
  _, got = launched(run, PS_ONE_WORKER, "tf_parameter_server.py", [run / "page"], "[chief-0] ")
  assert got["fit"] == {"epochs": 5, "iterations": 100}
  assert_same(got["fit_loss"], _one_device_model_fit()["fit_loss"], "fit_loss")
  want = _plain_parameter_server_loop(tmp_path / "plain")
  for section in ("loop_accuracy", "loop_counted", "final_loss", "inline_evaluation",
                  "distributed_evaluation"):
    assert_same(got[section], want[section], section)


def test_the_parameter_server_page_on_the_shipped_config_counts_every_step(tmp_path):
  """Two asynchronous workers and an evaluator (configs/parameter_server.yaml): no value is
  one device's, but every count is exact: the Model.fit section's 100 updates and its files
  (an epoch's checkpoint each, the backup removed), the custom loop's metric counting each of
  an epoch's 5 batches once (Keras's non-atomic add lost 64 of 160 labels on the ps), and the
  page's sidecar evaluator's last evaluation equal to Keras's own evaluate of the last
  checkpoint."""
  run = tmp_path / "run"
  (run / "page").mkdir(parents=True)
  output, got = launched(run, shipped("parameter_server.yaml", tmp_path / "shipped"),
                         "tf_parameter_server.py", [run / "page"], "[chief-0] ")
  assert got["fit"] == {"epochs": 5, "iterations": 100}
  assert got["fit_files"] == [f"ckpt-{e}.keras" for e in range(1, 6)] + ["log"]
  # Each worker's stream of 200 examples in batches of 32 has a batch of 8 every 7th: which
  # of them the last epoch's 5 steps took depends on which worker ran them, so its count is
  # 32k + 8(5 - k); a lost increment leaves 4 batches' labels (or fewer), never of that form.
  counted = got["loop_counted"]
  assert 40 <= counted <= 160 and (counted - 40) % 24 == 0, counted
  assert all(0.0 <= a <= 1.0 for a in got["loop_accuracy"])
  assert math.isfinite(got["final_loss"])
  sidecar = results((run / "logs" / "evaluator-0.log").read_text())["sidecar"]
  last, loss = sidecar[-1]
  assert last == "ckpt-5.keras"
  import tensorflow as tf
  keras.utils.set_random_seed(0)
  x, y = tf.random.uniform((10, 10), seed=1), tf.random.uniform((10, 1), seed=2)
  model = keras.models.load_model(run / "page" / "my_working_dir" / last)
  np.testing.assert_allclose(loss, model.evaluate(x, y, batch_size=10, verbose=0),
                             atol=TOLERANCE)
