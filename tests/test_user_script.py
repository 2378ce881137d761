"""One ordinary Keras script (tests/programs/user_script.py), unchanged, under every strategy
through `tfdist launch`: a tf.data pipeline built in `tfdist.fit`'s argument list, the user's
own ModelCheckpoint, CSVLogger and BackupAndRestore, and `model.save`."""

import re
import sys

import keras
import numpy as np
import pytest

from tests.conftest import PROGRAMS
from tests.launching import finish, start_launch

SCRIPT = PROGRAMS / "user_script.py"
FLOAT32 = "training: {global_batch_size: 64, epochs: 3, mixed_precision: off}\n"
CONFIGS = {
    "default": FLOAT32,
    "mirrored": "strategy: mirrored\ndevices: {logical_cpus: 2}\n" + FLOAT32,
    "multi_worker_mirrored": "cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n" + FLOAT32,
    "parameter_server": "cluster: {chief: 1, worker: 2, ps: 1}\nstrategy: parameter_server\n"
                        "training: {global_batch_size: 64, epochs: 3, steps_per_epoch: 16, "
                        "steps_per_execution: 4, mixed_precision: off}\n",
}


def launch(base, strategy, kind="dataset"):
  """Runs the script under `strategy` through the launcher; returns (exit code, output, dir)."""
  out = base / f"{strategy}-{kind}"
  (out / "tmp").mkdir(parents=True)
  config = out / "config.yaml"
  config.write_text(CONFIGS[strategy])
  process = start_launch(str(config), "--logs", str(out / "logs"), "--", sys.executable,
                         str(SCRIPT), str(out), kind, env={"TMPDIR": str(out / "tmp")})
  output = finish(process, 240, [])
  return process.returncode, output, out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  base = tmp_path_factory.mktemp("user-script")
  cache = {}

  def run(strategy, kind="dataset"):
    if (strategy, kind) not in cache:
      cache[strategy, kind] = launch(base, strategy, kind)
    return cache[strategy, kind]
  return run


def weights(out):
  saved = np.load(out / "result.npz")
  return [saved[f"w{i}"] for i in range(len(saved.files) - 1)]


@pytest.mark.parametrize("strategy", list(CONFIGS))
def test_the_same_script_trains_under_every_strategy(runs, strategy):
  code, output, out = runs(strategy)
  assert code == 0, output[-3000:]
  assert float(np.load(out / "result.npz")["loss"]) < 1.9, output[-3000:]


def plain_keras_weights():
  """The script's training written for plain Keras on one device, no tfdist: the same data,
  seed, model, optimizer, batch and epochs, `model.fit` of the same dataset."""
  import tensorflow as tf
  from sklearn.datasets import load_digits
  x, y = load_digits(return_X_y=True)
  x, y = (x / 16.0).astype("float32")[:1024], y.astype("int32")[:1024]
  keras.utils.set_random_seed(7)
  model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                            keras.layers.Dense(10)])
  model.compile(optimizer=keras.optimizers.SGD(0.1),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(64), epochs=3, verbose=0)
  return model.get_weights()


@pytest.mark.parametrize("strategy", ["default", "multi_worker_mirrored"])
def test_the_script_under_one_device_and_two_workers_equals_plain_keras(runs, strategy):
  code, output, out = runs(strategy)
  assert code == 0, output[-3000:]
  for got, want in zip(weights(out), plain_keras_weights(), strict=True):
    np.testing.assert_allclose(got, want, atol=1e-5)


def placed(output: str) -> dict[str, set[str]]:
  """{weight path: the device kinds and numbers of its copies} from the script's PLACED lines
  (the chief's, or the only task's)."""
  found = {}
  for task, path, devices in re.findall(r"PLACED (\S+) (\S+) (\S+)", output):
    if task in ("local", "worker-0", "chief-0"):
      found[path] = {d.split("device:")[-1] if "/job:ps" not in d else "ps:" +
                     d.split("device:")[-1] for d in devices.split(",")}
  return found


@pytest.mark.parametrize("strategy,devices", [("default", {"CPU:0"}),
                                              ("mirrored", {"CPU:0", "CPU:1"}),
                                              ("parameter_server", {"ps:CPU:0"})])
def test_each_weight_lives_where_the_strategy_puts_it(runs, strategy, devices):
  code, output, _ = runs(strategy)
  assert code == 0, output[-3000:]
  where = placed(output)
  assert len(where) == 4 and all(d == devices for d in where.values()), where


@pytest.mark.parametrize("strategy,kind", [("mirrored", "function"), ("default", "generator")])
def test_dataset_functions_and_generators_equal_a_dataset(runs, strategy, kind):
  code, output, out = runs(strategy, kind)
  assert code == 0, output[-3000:]
  for a, b in zip(weights(runs("default")[2]), weights(out), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_the_users_files_are_written_once_by_the_chief_and_load(runs):
  code, output, out = runs("multi_worker_mirrored")
  assert code == 0, output[-3000:]
  written = sorted(str(p.relative_to(out)) for p in out.rglob("*")
                   if p.is_file() and "logs" not in p.parts and p.name != "config.yaml")
  assert written == ["checkpoints/epoch-1.keras", "checkpoints/epoch-2.keras",
                     "checkpoints/epoch-3.keras", "final.keras", "log.csv", "result.npz"]
  assert len((out / "log.csv").read_text().splitlines()) == 4  # Header and 3 epochs, once.
  assert not list((out / "tmp").iterdir())  # The other worker's copies were removed.
  for path in ["final.keras", "checkpoints/epoch-3.keras"]:
    model = keras.saving.load_model(out / path)
    np.testing.assert_allclose(model.get_weights()[0], weights(out)[0], atol=1e-6)


def test_the_start_line_is_printed_once_and_the_progress_bar_counts_the_epoch(runs):
  _, output, _ = runs("multi_worker_mirrored")
  starts = [line for line in output.splitlines() if "tfdist: multi_worker_mirrored" in line]
  assert len(starts) == 1 and starts[0].startswith("[worker-0]"), output[-3000:]
  assert ("2 replicas, global batch 64 (32 per replica). Unlike plain Keras: 16 steps per "
          "call, batch callbacks once per call (training.steps_per_execution: 1)") in starts[0]
  assert "fused" not in starts[0]  # Keras's own update by default.
  assert "32/16" not in output
  # The terminal shows the chief's progress alone: each epoch's line once, none of worker-1's.
  assert len(re.findall(r"^\[worker-0\] 16/16 ", output, re.M)) == 3
  assert "[worker-1]" not in output
  assert "showing the chief's output; every task's is in its log (--verbose shows all)" in output


def test_a_generator_under_parameter_server_is_refused_in_one_line(runs):
  code, output, _ = runs("parameter_server", "generator")
  assert code == 2  # The chief's usage error: no restart would mend it.
  assert ("tfdist: train_data: parameter-server workers cannot run the chief's Python (a "
          "generator or a keras.utils.PyDataset): pass a tf.data.Dataset built from arrays or "
          "files, or a dataset function. Received: a generator (TFDIST_TRACEBACK=1 shows the "
          "traceback)") in output
  assert "Traceback" not in output and "(exit code 2)" in output
