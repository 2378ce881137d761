"""A model split over devices (tfdist.parallel) on 2 logical CPUs in this process, and on 4 in a
launched user script: where variables, slots and ops are placed, and equality with the unsplit
model after training, with and without micro-batches; tensor-parallel Dense against Dense; the
refusals."""

import json
import re
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import PROGRAMS
from tests.launching import finish, start_launch
from tfdist.errors import ConfigError, ModelError
from tfdist.testing import forked

pytestmark = pytest.mark.usefixtures("two_cpus")
CPU0, CPU1 = "/job:localhost/replica:0/task:0/device:CPU:0", \
    "/job:localhost/replica:0/task:0/device:CPU:1"
rng = np.random.default_rng(0)
X, Y = rng.random((96, 8), dtype=np.float32), rng.random((96, 3), dtype=np.float32)


def sequential(optimizer="adam"):
  keras.utils.set_random_seed(3)
  model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu", name="a"),
                            keras.layers.Dropout(0.0, name="drop"),
                            keras.layers.Dense(16, activation="tanh", name="b"),
                            keras.layers.Dense(3, name="c")])
  model.compile(keras.optimizers.get({"class_name": optimizer, "config": {"learning_rate": 0.01}}),
                "mse", metrics=["mae"])
  return model


def functional():
  keras.utils.set_random_seed(3)
  inputs = keras.Input((8,))
  left = keras.layers.Dense(8, activation="relu", name="left")(inputs)
  right = keras.layers.Dense(8, activation="relu", name="right")(inputs)
  joined = keras.layers.Concatenate(name="join")([left, right])
  outputs = keras.layers.Dense(3, name="out")(joined)
  model = keras.Model(inputs, outputs)
  model.compile(keras.optimizers.Adam(0.01), "mse")
  return model


class Subclassed(keras.Model):
  def __init__(self):
    super().__init__()
    self.first = keras.layers.Dense(16, activation="relu")
    self.second = keras.layers.Dense(3)

  def call(self, x):
    return self.second(self.first(x))


def subclassed():
  keras.utils.set_random_seed(3)
  model = Subclassed()
  model(X[:1])  # Built in model_fn, as tfdist.parallel.split requires.
  model.compile(keras.optimizers.Adam(0.01), "mse")
  return model


def embedding():
  """Token ids in: the Embedding's gradient is sparse (IndexedSlices), and micro-batches
  looking up the same rows must add up."""
  keras.utils.set_random_seed(3)
  model = keras.Sequential([keras.Input((8,), dtype="int32"),
                            keras.layers.Embedding(12, 4, name="embed"),
                            keras.layers.GlobalAveragePooling1D(name="pool"),
                            keras.layers.Dense(3, name="c")])
  model.compile(keras.optimizers.Adam(0.01), "mse")
  return model


TOKENS = (X * 12).astype("int32")  # Every row repeats ids: 96 x 8 lookups of 12 rows.


def trained(model):
  x = TOKENS if "embed" in [layer.name for layer in model.layers] else X
  model.fit(x, Y, batch_size=24, epochs=3, shuffle=False, verbose=0)
  return model


def split(model, stages, microbatches=1):
  from tfdist.parallel.split_model import split as split_model
  return split_model(model, stages, devices=["/device:CPU:0", "/device:CPU:1"],
                     microbatches=microbatches)


def largest_difference(a, b):
  return max(float(np.abs(x - y).max()) for x, y in zip(a.get_weights(), b.get_weights()))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_variables_and_optimizer_slots_live_on_their_stages_device(optimizer):
  model = trained(split(sequential(optimizer), [["a", "drop"], ["b", "c"]]))
  stage = {"a": CPU0, "b": CPU1, "c": CPU1}
  for layer in ("a", "b", "c"):
    assert {w.value.device for w in model.get_layer(layer).weights} == {stage[layer]}
  slots = [v for v in model.optimizer.variables if "_kernel_" in v.path or "_bias_" in v.path]
  assert slots or optimizer == "sgd"
  for slot in slots:
    layer = re.search(r"_([abc])_(kernel|bias)_", slot.path).group(1)
    assert slot.value.device == stage[layer], slot.path


def test_forward_and_gradient_ops_run_on_their_stages_device():
  model = split(sequential("sgd"), [["a"], ["b", "c"]])
  spec = (tf.TensorSpec([24, 8]), tf.TensorSpec([24, 3]))
  graph = tf.function(lambda x, y: model.train_step((x, y))).get_concrete_function(*spec).graph
  matmuls = {}
  for op in graph.get_operations():
    if op.type == "MatMul":
      kind = "gradient" if "gradients" in op.name else "forward"
      layer = "a" if re.search(r"/a(_\d+)?/", op.name) else "bc"
      matmuls.setdefault((kind, layer), set()).add(op.device)
  assert matmuls[("forward", "a")] == {"/device:CPU:0"}
  assert matmuls[("forward", "bc")] == {"/device:CPU:1"}
  assert matmuls[("gradient", "a")] == {"/device:CPU:0"}
  assert matmuls[("gradient", "bc")] == {"/device:CPU:1"}


@pytest.mark.parametrize("microbatches", [1, 4, 5])  # 24 / 5: micro-batches of 5 and 4.
@pytest.mark.parametrize("make,stages", [(sequential, [["a"], ["b", "c"]]),
                                         (functional, "balanced"),
                                         (subclassed, [[0], [1]]),
                                         (embedding, [["embed"], ["pool", "c"]])])
def test_a_split_model_trains_and_predicts_as_the_unsplit_one(make, stages, microbatches):
  reference = trained(make())
  model = trained(split(make(), stages, microbatches))
  assert largest_difference(model, reference) < 1e-5
  import tfdist
  x = TOKENS if make is embedding else X
  np.testing.assert_allclose(tfdist.predict(model, x, batch_size=24, verbose=0),
                             reference.predict(x, batch_size=24, verbose=0), atol=1e-5)


def test_balanced_stages_even_out_the_parameters():
  from tfdist.parallel.placement import assign, balanced_stages
  assert balanced_stages([3, 3, 2, 2, 2], 2) == [0, 0, 1, 1, 1]
  assert balanced_stages([1, 1], 4) == [0, 1]
  model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, name="big"),
                            keras.layers.Dense(8, name="s1"), keras.layers.Dense(8, name="s2")])
  first, second = "/device:CPU:0", "/device:CPU:1"
  assert assign(model, "balanced", ["CPU:0", "CPU:1"]) == {"big": first, "s1": second,
                                                           "s2": second}
  assert assign(model, {"s1": "/cpu:1"}, ["CPU:0"]) == {"big": first, "s1": second,
                                                        "s2": second}


def test_column_and_row_parallel_dense_equal_dense():
  from tfdist.parallel.tensor import (ColumnParallelDense, RowParallelDense, column_parallel,
                                      row_parallel)
  devices = ["/device:CPU:0", "/device:CPU:1"]
  dense = keras.layers.Dense(7, activation="relu")
  dense.build((None, 8))
  columns, rows = column_parallel(dense, devices), row_parallel(dense, devices)
  assert [k.value.device for k in columns.kernels] == [CPU0, CPU1]
  assert [tuple(k.shape) for k in rows.kernels] == [(4, 7), (4, 7)]
  np.testing.assert_array_equal(columns(X), dense(X))
  np.testing.assert_allclose(rows(X), dense(X), atol=1e-6)
  inputs = keras.Input((8,))  # An MLP block: column-parallel then row-parallel, no gather.
  hidden = ColumnParallelDense(12, devices, activation="relu", gather=False)(inputs)
  model = keras.Model(inputs, RowParallelDense(3, devices)(hidden))
  model.compile("adam", "mse")
  before = model.evaluate(X, Y, verbose=0)
  model.fit(X, Y, epochs=5, verbose=0)
  assert model.evaluate(X, Y, verbose=0) < before


@pytest.mark.parametrize("change,key,error_type", [
    (lambda m: setattr(m, "jit_compile", True) or m, "jit_compile", ModelError),
    (lambda m: m, "parallel.devices", ConfigError),
    (lambda m: m, "parallel.stages", ConfigError),
])
def test_split_refusals_name_the_setting(change, key, error_type):
  model = change(sequential())
  devices = ["/device:CPU:0", "/device:GPU:3"] if key == "parallel.devices" else None
  stages = [["c"], ["a"]] if key == "parallel.stages" else [["a"], ["b", "c"]]
  from tfdist.parallel.split_model import split as split_model
  with pytest.raises(error_type) as error:
    split_model(model, stages, devices=devices or ["/device:CPU:0", "/device:CPU:1"])
  assert str(error.value).startswith(key) or f" {key}:" in str(error.value), str(error.value)


def launched_split_fit(tmp_path, config_text: str):
  """Runs tests/programs/split_fit.py under `tfdist launch`: (its output, the chief's result)."""
  config = tmp_path / "config.yaml"
  config.write_text(config_text)
  launcher = start_launch(str(config), "--logs", str(tmp_path / "logs"), "--", sys.executable,
                          str(PROGRAMS / "split_fit.py"), str(tmp_path / "result.json"))
  output = finish(launcher, 240, [])
  assert launcher.returncode == 0, output[-3000:]
  return output, json.loads((tmp_path / "result.json").read_text())


def test_a_users_script_splits_its_model_from_the_config(tmp_path):
  """The YAML's parallel: section under `tfdist launch`, on 4 logical CPUs: placement and
  equality with plain Keras's unsplit training, in the launched process."""
  output, result = launched_split_fit(
      tmp_path, "devices: {logical_cpus: 4}\n"
      # Keras's own Adam update, as the plain-Keras reference uses.
      "training: {global_batch_size: 32, epochs: 2, mixed_precision: off, "
      "fused_optimizer: false}\n"
      "parallel: {stages: balanced, microbatches: 4}\n")
  assert "tfdist: model split into 4 stages (" in output and "4 micro-batches" in output
  assert result["difference"] < 1e-5
  assert sorted(set(result["devices"].values())) == [f"CPU:{i}" for i in range(4)]


def cnn():
  keras.utils.set_random_seed(3)
  model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(32, 3, name="conv"),
                            keras.layers.Flatten(name="flat"), keras.layers.Dense(64, name="fc"),
                            keras.layers.Dense(10, name="out")])
  model.compile(keras.optimizers.SGD(0.01, momentum=0.9), "mse")
  return model


@pytest.mark.parametrize("make", [sequential, functional, cnn])
def test_the_estimated_bytes_per_device_match_the_variables_placed(make):
  from tfdist.parallel import estimates
  from tfdist.parallel.split_model import split as split_model
  model = make()
  plan = estimates.estimate_memory(model, batch=8, devices=2)
  model = split_model(model, "balanced", devices=["/device:CPU:0", "/device:CPU:1"])
  x = np.zeros((8, *model.input_shape[1:]), np.float32)
  model.fit(x, np.zeros((8, *model.output_shape[1:]), np.float32), verbose=0)  # Builds slots.
  measured = {}
  for variable in model.weights + model.optimizer.variables:
    device = variable.value.device
    measured[device] = measured.get(device, 0) + estimates._bytes(variable)
  estimated = [stage.variables for stage in plan["split"]]
  assert len(estimated) == 2 and sorted(measured) == [CPU0, CPU1]
  for estimate, device in zip(estimated, (CPU0, CPU1)):
    assert abs(estimate - measured[device]) <= 0.1 * measured[device], (estimated, measured)
  assert plan["data_parallel"].variables == sum(estimated)


def test_the_estimate_says_which_zero_stage_makes_a_model_fit():
  """Each ZeRO stage's row, computed here by hand from what its step holds (the terms
  `sharding_memory` lists), and the recommendation at capacities between the rows: the first
  stage that fits, stage 3 said to be the only one when it is, a stage the run would refuse
  passed over with its reason."""
  from tfdist.parallel import estimates
  from tfdist.training import sharding_memory
  model = keras.Sequential([keras.Input((512,)), keras.layers.Dense(2048),
                            keras.layers.Dense(512)])
  model.compile("adam", "mse")
  plan = estimates.estimate_memory(model, batch=8, devices=1, replicas=4)
  rows = sharding_memory.stage_rows(plan)
  whole = plan["data_parallel"]
  weights = model.count_params() * 4  # All trainable, float32.
  largest, shard, piece = 512 * 2048 * 4, -(-weights // 4), 1 << 20
  held = {"sharded": weights + 2 * shard, "sharded_gradients": weights + 2 * shard,
          "sharded_parameters": 3 * shard}  # Weights (or their shard) and Adam's 2 slots.
  passes = {"sharded": whole.activations + whole.working,
            "sharded_gradients": whole.activations + whole.working,
            # Gathered a bucket at a time, each freed as its gradients appear: the largest
            # bucket (a run of weights closed at a piece or more) and its all-reduce's input.
            "sharded_parameters": whole.activations + whole.working
            + 2 * min(weights, largest + piece)}
  update = {"sharded": 2 * weights + 3 * shard + largest + 4 * piece,
            "sharded_gradients": 2 * shard + 2 * piece + 3 * shard + largest + 4 * piece,
            "sharded_parameters": 2 * shard + 2 * piece + 3 * shard}
  assert (whole.weights, whole.gradients, whole.optimizer) == (weights, weights, 2 * weights)
  assert whole.total == 4 * weights + max(whole.activations + whole.working, weights)
  for key, row in rows.items():
    assert row.total == held[key] + weights + max(passes[key], update[key]), key
  plan.update(rows)
  totals = {key: row.total for key, row in rows.items()}
  assert totals["sharded_parameters"] < min(whole.total, totals["sharded"],
                                            totals["sharded_gradients"]), totals
  assert estimates.recommend(plan, whole.total).startswith("data parallel: the whole model")
  only = (totals["sharded_parameters"] + min(whole.total, totals["sharded_gradients"])) // 2
  said = estimates.recommend(plan, only)
  assert said.startswith("data parallel with the weights sharded too (training.zero_stage: 3) "
                         "fits "
                         "(no stage before it does): "), said
  plan["refused"] = {"sharded_parameters": "weight_decay decays whole weights"}
  assert "refuses this model: weight_decay decays whole weights" in \
      estimates.recommend(plan, only)


_ESTIMATED_MODELS = (
    "import keras\n"
    "def mlp():\n"
    "  model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(1024),\n"
    "                            keras.layers.Dense(10)])\n"
    "  model.compile('adam', 'mse')\n"
    "  return model\n"
    "def uncompiled():\n"
    "  return keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])\n")
"""The models module a user's `tfdist estimate --model models:mlp` imports."""


def test_tfdist_estimate_names_stage_3_where_only_it_fits(tmp_path):
  """A user's 4-worker config and compiled model: `tfdist estimate` prints each ZeRO stage's
  row; given a memory between stage 3's total and the lowest other's (read from its own
  table, as a user would), it recommends stage 3 with the three settings that turn it on."""
  from tests.launching import ENV
  (tmp_path / "models.py").write_text(_ESTIMATED_MODELS)
  (tmp_path / "config.yaml").write_text("cluster: {worker: 4}\n"
                                        "strategy: multi_worker_mirrored\n")
  command = [sys.executable, "-m", "tfdist", "estimate", "config.yaml", "--model",
             "models:mlp", "--batch", "64"]
  done = forked.run(command, cwd=tmp_path, env=ENV, timeout=120)
  assert done.returncode == 0, done.stderr[-2000:]
  totals = {line[:24].strip(): float(line.split()[-2]) for line in done.stdout.splitlines()
            if line.startswith(("data parallel, each", "  optimizer sharded",
                                "  + gradients sharded", "  + weights sharded"))}
  assert len(totals) == 4, done.stdout
  third = totals.pop("+ weights sharded")
  assert third < min(totals.values()), done.stdout
  memory = (third + min(totals.values())) / 2
  capped = forked.run(command + ["--memory", f"{memory:.2f}MiB"], cwd=tmp_path, env=ENV,
                      timeout=120)
  assert capped.returncode == 0, capped.stderr[-2000:]
  assert ("data parallel with the weights sharded too (training.zero_stage: 3) fits (no stage "
          "before "
          "it does): ") in capped.stdout, capped.stdout


def test_tfdist_estimate_prints_the_table_and_a_recommendation(tmp_path):
  from tests.launching import ENV
  (tmp_path / "models.py").write_text(_ESTIMATED_MODELS)
  (tmp_path / "config.yaml").write_text("devices: {logical_cpus: 2}\n"
                                        "parallel: {stages: balanced}\n")
  done = forked.run([sys.executable, "-m", "tfdist", "estimate", "config.yaml", "--model",
                     "models:mlp", "--batch", "64"], cwd=tmp_path, env=ENV,
                    timeout=120)
  assert done.returncode == 0, done.stderr[-2000:]
  lines = done.stdout.splitlines()
  assert lines[0].startswith("Sequential of 814,090 parameters, global batch 64, 2 device(s)")
  weights = 814090 * 4 / 2 ** 20
  assert any(line.startswith("data parallel, each") and f"{weights:.2f} MiB" in line
             and f"{2 * weights:.2f} MiB" in line for line in lines)  # Adam: 2 slots.
  assert "data parallel: the whole model fits each device" in done.stdout
  # Sharded (issues 34, 53, 62): Adam's two slots of half the weights; stage 2's step still
  # holds the replica's whole gradients (its reduced shard is in the update column).
  sharded = 2 * 407045 * 4 / 2 ** 20
  assert any(line.startswith("  optimizer sharded") and f"{sharded:.2f} MiB" in line
             for line in lines), done.stdout
  assert any(line.startswith("  + gradients sharded") and
             line.split()[3:7] == [f"{weights:.2f}", "MiB", f"{weights:.2f}", "MiB"]
             for line in lines), done.stdout  # Weights, gradients: whole.
  assert any(line.startswith("  + weights sharded") and f"{weights / 2:.2f} MiB" in line
             for line in lines), done.stdout  # Stage 3: half the weights held.
  # The all-reduce model: 2(N-1)/N x gradient bytes / 12.5 GB/s at 512 devices.
  milliseconds = 1000 * 2 * 511 / 512 * 814090 * 4 / 12.5e9
  assert f"   512 devices: {milliseconds:.2f} ms a step" in done.stdout
  assert "optimizer: not counted" not in done.stdout
  bare = forked.run([sys.executable, "-m", "tfdist", "estimate", "config.yaml", "--model",
                     "models:uncompiled", "--batch", "8"], cwd=tmp_path, env=ENV,
                    timeout=120)
  assert ("optimizer: not counted: models:uncompiled returns a model that is not compiled"
          in bare.stdout), bare.stdout + bare.stderr[-2000:]
  bad = forked.run([sys.executable, "-m", "tfdist", "estimate", "config.yaml", "--model",
                    "models"], cwd=tmp_path, env=ENV, timeout=120)
  assert bad.returncode == 2
  assert bad.stderr.strip().splitlines()[-1] == ("tfdist estimate: --model: must be "
                                                 "module:function, the function that builds "
                                                 "the model. "
                                                 "Received: 'models'")


def test_two_workers_each_splitting_its_model_train_as_one_device(tmp_path):
  """Hybrid: data parallel across 2 worker processes, each worker's model split over its own 2
  logical CPUs, gradients averaged with TensorFlow's collectives; equal to one device."""
  output, result = launched_split_fit(  # The chief's result.
      tmp_path, "cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n"
      "devices: {logical_cpus: 2}\n"
      "training: {global_batch_size: 32, epochs: 2, mixed_precision: off, "
      "fused_optimizer: false}\n"
      "parallel: {stages: balanced, microbatches: 2}\n")
  assert "[worker-0] tfdist: model split into 2 stages (" in output
  assert result["difference"] < 1e-5
  assert sorted(set(result["devices"].values())) == ["CPU:0", "CPU:1"]


def test_two_workers_splitting_an_embedding_model_train_as_one_device(tmp_path):
  """Hybrid with an Embedding (its gradient sparse, rows repeating within and across the
  workers' slices; tests/programs/sparse_sharded.py): each worker's rows are gathered, not summed
  dense (which trained 0.043 off plain Keras's Adam, 2026-11-29); both workers end with plain
  Keras's one-device weights."""
  config = tmp_path / "config.yaml"
  config.write_text("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n"
                    "devices: {logical_cpus: 2}\n"
                    "training: {global_batch_size: 32, epochs: 2, mixed_precision: 'off', "
                    "fused_optimizer: false, steps_per_execution: 1}\n"
                    "parallel: {stages: balanced, microbatches: 2}\n")
  launcher = start_launch(str(config), "--logs", str(tmp_path / "logs"), "--verbose", "--",
                          sys.executable, "-m", "tests.programs.sparse_sharded", "adam")
  output = finish(launcher, 240, [])
  assert launcher.returncode == 0, output[-3000:]
  assert "[worker-0] tfdist: model split into 2 stages (input_layer, embedding on CPU:0" in output
  diffs = [float(line.rsplit(" ", 1)[1]) for line in output.splitlines() if "MAX_DIFF" in line]
  assert len(diffs) == 2 and max(diffs) < 1e-5, output[-3000:]


def test_recomputed_activations_train_as_the_unsplit_model():
  from tfdist.parallel.split_model import split as split_model

  def matmuls(model):
    spec = (tf.TensorSpec([24, 8]), tf.TensorSpec([24, 3]))
    graph = tf.function(lambda x, y: model.train_step((x, y))).get_concrete_function(*spec).graph
    return sum(op.type == "MatMul" for op in graph.get_operations())
  devices = ["/device:CPU:0", "/device:CPU:1"]
  kept = split_model(sequential("sgd"), [["a"], ["b", "c"]], devices=devices)
  recomputed = split_model(sequential("sgd"), [["a"], ["b", "c"]], devices=devices,
                           recompute=True)
  assert matmuls(recomputed) == matmuls(kept) + 3  # Each Dense's forward matmul, again.
  assert largest_difference(trained(recomputed), trained(sequential("sgd"))) < 1e-5


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_tfdist_estimate_reads_the_clusters_replicas_and_the_sharded_optimizer(tmp_path,
                                                                               workers):
  """A 2- and 4-worker config plans each replica's share of the global batch, and the sharded
  optimizer's row: Adam's 2 slots of 1/N of the weights and the 1/N of the weights they update
  (counted by hand); one worker has no replicas to shard over. Activations kept scale with the
  per-replica batch (the per-device figure is checked against measured peaks in
  tests/test_step_memory.py)."""
  from tests.launching import ENV
  (tmp_path / "models.py").write_text(_ESTIMATED_MODELS)
  sharding = ", zero_stage: 1" if workers > 1 else ""
  (tmp_path / "config.yaml").write_text(f"cluster: {{worker: {workers}}}\n"
                                        f"training: {{global_batch_size: 64{sharding}}}\n")
  done = forked.run([sys.executable, "-m", "tfdist", "estimate", "config.yaml", "--model",
                     "models:mlp"], cwd=tmp_path, env=ENV, timeout=120)
  assert done.returncode == 0, done.stderr[-2000:]
  lines = done.stdout.splitlines()
  if workers > 1:
    assert lines[0] == (f"Sequential of 814,090 parameters, global batch 64 ({64 // workers} "
                        f"per replica), {workers} replica(s): {workers} worker(s) x 1 "
                        "device(s) (multi_worker_mirrored); split over this process's 1 "
                        "device(s): CPU:0"), lines[0]
    sharded = 2 * 814090 * 4 / workers / 2 ** 20
    assert any(line.startswith("  optimizer sharded") and f"{sharded:.2f} MiB" in line
               for line in lines), done.stdout
  else:
    assert not any(line.startswith("  optimizer sharded") for line in lines)
  each = next(line for line in lines if line.startswith("data parallel, each")).split()
  activations = float(each[9])  # weights, gradients, optimizer, activations, ... (MiB).
  # Kept for the backward pass: the input and the hidden layer, 4 bytes each, per replica.
  assert activations == pytest.approx((784 + 1024) * 4 * 64 / workers / 2 ** 20, abs=0.006)
