"""Every training path keeps every guarantee (issue 33): each setting of `training.settings`
walked through `tfdist.fit` and `tfdist.TrainingLoop`, applied (it changes the run) or refused
in one line naming the key; the loop's preemption through the launcher; the precision tfdist
chose given back; per-output losses of uneven batches as one device's; the Python API's bad
input refused before training."""

import os
import signal
import sys
import unittest.mock

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
import tfdist.progress as progress
from tfdist.config import honoured
from tfdist.training import settings
from tests.conftest import PROGRAMS
from tests.launching import finish, read_until, start_launch
from tests.programs import custom_loop

pytestmark = pytest.mark.usefixtures("two_cpus")
BASE = {"global_batch_size": 32, "mixed_precision": "off", "steps_per_execution": 1,
        "fused_optimizer": False, "epochs": 2}
MIRRORED = {"strategy": "mirrored", "devices": {"logical_cpus": 2}}
DEFAULT = {"strategy": "default"}


def _model():
  keras.utils.set_random_seed(3)
  return keras.Sequential([keras.Input((16,)), keras.layers.Dense(16, activation="relu"),
                           keras.layers.Dense(2)])


def _observe(model, optimizer) -> dict:
  inner = getattr(optimizer, "inner_optimizer", optimizer)
  return {"policy": model.layers[0].dtype_policy.name,
          "preemption_signal": signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL,
          "fused": "update_step" in vars(inner),
          "split": hasattr(model, "tfdist_placement"),
          "sharded": hasattr(inner, "tfdist_shards"),
          "scattered": getattr(getattr(inner, "tfdist_shards", None), "scatter", False)}


class _Probe(keras.callbacks.Callback):
  def __init__(self):
    super().__init__()
    self.calls, self.seen = 0, {}

  def on_train_batch_end(self, batch, logs=None):
    self.calls += 1
    self.seen = _observe(self.model, self.model.optimizer)


# SGD with momentum: a state to shard (training.zero_stage: 1 refuses plain SGD's none).


def run_fit(config: dict) -> dict:
  x, y = custom_loop.data()
  probe = _Probe()
  history = tfdist.fit(_model, x, y, config=config, shuffle=False, verbose=0,
                       callbacks=[probe], compile=lambda: dict(
                           optimizer=keras.optimizers.SGD(0.1, momentum=0.5), loss=keras.losses.
                           SparseCategoricalCrossentropy(from_logits=True)))
  return {"weights": [w.numpy() for w in history.model.weights], "calls": probe.calls,
          **probe.seen}


def run_loop(config: dict) -> dict:
  loop = tfdist.TrainingLoop(config)
  with loop.scope():
    model, optimizer = _model(), keras.optimizers.SGD(0.1, momentum=0.5)
  loop.prepare(model, optimizer)
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  def step(x, y):
    with tf.GradientTape() as tape:
      loss = loss_fn(y, model(x, training=True))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                  model.trainable_variables))
    return loss
  x, y = custom_loop.data()
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
  calls, seen = [], {}
  begin_call = progress.begin_call  # Called once per compiled call (the hang watch's record).
  with unittest.mock.patch.object(progress, "begin_call",
                                  lambda *a: calls.append(a) or begin_call(*a)):
    for _ in loop.epochs(config["training"]["epochs"]):
      for _ in loop.run(step, dataset):  # One dict per step, however many a call runs.
        seen = _observe(model, optimizer)
  return {"weights": [w.numpy() for w in model.weights], "calls": len(calls), **seen}


RUNS = {settings.FIT: run_fit, settings.LOOP: run_loop}
# Each setting asked for (strategy, config changes) and what shows it acted on the run.
ASKED = {
    "training.mixed_precision": (DEFAULT, {"training": {"mixed_precision": "bfloat16"}},
                                 lambda on, off: on["policy"] == "mixed_bfloat16" != off["policy"]),
    "training.fused_optimizer": (DEFAULT, {"training": {"fused_optimizer": True}},
                                 lambda on, off: on["fused"] and not off["fused"]),
    "training.gradient_compression": (MIRRORED, {"training": {"gradient_compression": "bfloat16"}},
                                      lambda on, off: _moved(on, off)),
    "training.gradient_accumulation_steps": (DEFAULT,
                                             {"training": {"gradient_accumulation_steps": 2}},
                                             lambda on, off: _moved(on, off)),
    "training.zero_stage": (MIRRORED, {"training": {"zero_stage": 2}},
                            lambda on, off: on["sharded"] and on["scattered"] and
                            not off["sharded"] and not off["scattered"] and
                            not _moved(on, off)),
    "parallel.stages": (DEFAULT, {"parallel": {"stages": [[0], [1]]}},
                        lambda on, off: on["split"] and not off["split"]),
    "checkpoint.preemption_signal": (DEFAULT, {"checkpoint": {"preemption_signal": "SIGUSR1"}},
                                     lambda on, off: on["preemption_signal"] and
                                     not off["preemption_signal"]),
    "training.steps_per_execution": (DEFAULT, {"training": {"steps_per_execution": 2}},
                                     lambda on, off: on["calls"] * 2 == off["calls"]),
}
# training.average_every needs several workers: test_the_loop_applies_periodic_averaging.


def _moved(on, off) -> bool:
  return max(float(np.abs(a - b).max()) for a, b in zip(on["weights"], off["weights"],
                                                        strict=True)) > 1e-6


def _config(strategy: dict, changes: dict, tmp_path) -> dict:
  config = {**strategy, "training": dict(BASE)}
  for section, values in changes.items():
    if section == "training":
      config["training"].update(values)
    else:
      config[section] = values
  if "checkpoint" in changes:
    config["checkpoint"] = {**changes["checkpoint"], "dir": str(tmp_path / "checkpoints")}
  return config


_BASELINES: dict = {}


def _baseline(path: str, strategy: str) -> dict:
  """The run with no setting asked for, once per path and strategy."""
  if (path, strategy) not in _BASELINES:
    _BASELINES[path, strategy] = RUNS[path](_config({"strategy": strategy}, {}, None) if
                                            strategy == "default" else _config(MIRRORED, {}, None))
  return _BASELINES[path, strategy]


def test_every_setting_settings_applies_is_walked():
  """The keys `training.settings` applies to the optimizer and the run (the rest of each key's
  decision is tests/test_honoured.py's)."""
  assert set(ASKED) | {"training.average_every"} <= set(honoured.DECISIONS)


@pytest.mark.parametrize("path", list(RUNS))
@pytest.mark.parametrize("key", list(ASKED))
def test_each_setting_is_applied_or_refused_on_each_path(key, path, tmp_path):
  strategy, changes, acted = ASKED[key]
  on_config = _config(strategy, changes, tmp_path)
  if path in honoured.DECISIONS[key].refused:
    with pytest.raises(tfdist.ConfigError) as refused:
      RUNS[path](on_config)
    assert str(refused.value).startswith(f"<dict>: {key}: is not honoured by {path}: ")
    assert "\n" not in str(refused.value)
    return
  off = _baseline(path, strategy["strategy"])
  on = RUNS[path](on_config)
  assert acted(on, off), (key, path)


@pytest.mark.parametrize("text,key,path", [
    ("cluster: {chief: 1, worker: 1, ps: 1}\nstrategy: parameter_server\n"
     "training: {gradient_accumulation_steps: 2}\n", "training.gradient_accumulation_steps",
     settings.PARAMETER_SERVER),
    ("cluster: {worker: 2}\ntraining: {gradient_compression: bfloat16}\n"
     "parallel: {stages: balanced}\n", "training.gradient_compression",
     settings.SPLIT),
    ("cluster: {worker: 2}\ntraining: {average_every: 4}\n"
     "parallel: {stages: balanced}\n", "training.average_every", settings.SPLIT),
    ("parallel: {stages: balanced}\ntraining: {gradient_accumulation_steps: 2}\n",
     "training.gradient_accumulation_steps", settings.SPLIT),
    ("cluster: {worker: 2}\nparallel: {stages: balanced}\ntraining: {zero_stage: 1}\n",
     "training.zero_stage", settings.SPLIT),
])
def test_the_other_paths_refuse_in_one_line_and_check_says_so(write_config, text, key, path):
  import subprocess
  config_path = write_config(text)
  # Through the paths a user calls: refused before a strategy is made or a model built.
  with pytest.raises(tfdist.ConfigError) as refused:
    tfdist.fit(lambda: pytest.fail("built a model"), config=str(config_path))
  assert str(refused.value).startswith(f"{config_path}: {key}: is not honoured by {path}: ")
  with pytest.raises(tfdist.ConfigError) as by_the_loop:
    tfdist.TrainingLoop(str(config_path))
  assert str(by_the_loop.value) == str(refused.value)
  result = subprocess.run([sys.executable, "-m", "tfdist", "check", str(config_path)],
                          capture_output=True, text=True, timeout=60)
  assert result.returncode == 2 and result.stderr == f"tfdist check: {refused.value}\n"


def _launch(tmp_path, config_text, *args, env=None, name="logs"):
  (tmp_path / "config.yaml").write_text(config_text)
  return start_launch(str(tmp_path / "config.yaml"), "--logs", str(tmp_path / name), "--",
                      sys.executable, str(PROGRAMS / "custom_loop.py"), str(tmp_path / "out"),
                      *args, env=env)


MWMS_LOOP = ("cluster: {worker: 2}\ntraining: {global_batch_size: 32, mixed_precision: 'off', "
             "steps_per_execution: 2}\n")


def test_the_loop_applies_periodic_averaging(tmp_path):
  """training.average_every under the TrainingLoop on 2 workers: a hand-written local SGD's
  weights (each replica its own Adam on its half of each batch, the weights averaged every 2
  steps and at the end), not synchronous training's."""
  process = _launch(tmp_path, MWMS_LOOP.replace("steps_per_execution: 2}",
                                                "steps_per_execution: 2, average_every: 2}"),
                    "reduce_mean")
  output = finish(process, 240, [])
  assert process.returncode == 0, output[-3000:]
  result = np.load(tmp_path / "out" / "result.npz")
  want = custom_loop.local_sgd_by_hand(every=2)
  got = [result[f"w{i}"] for i in range(len(want))]
  for g, w in zip(got, want, strict=True):
    np.testing.assert_allclose(g, w, atol=1e-5)
  synchronous, _, _ = custom_loop.train_by_hand("reduce_mean", steps_per_execution=2)
  assert max(float(np.abs(a - b).max()) for a, b in zip(got, synchronous)) > 1e-4


def test_a_sigterm_to_the_launcher_preempts_the_loop_and_the_relaunch_resumes_there(tmp_path):
  """The TrainingLoop under multi_worker_mirrored: SIGTERM to the launcher mid-epoch makes both
  workers save after the same call and exit 42, the launcher 42; relaunched, the loop resumes
  at that step and ends with an uninterrupted one-device run's weights."""
  config = MWMS_LOOP + f"checkpoint: {{dir: {tmp_path / 'checkpoints'}}}\n"
  seen = []
  # Paused after epoch 2's 4th step, the end of its 2nd call of 2 steps.
  process = _launch(tmp_path, config, "reduce_mean", env={"PAUSE_AT": "2:4"})
  try:
    read_until(process, r"PAUSED", 180, seen)
    process.send_signal(signal.SIGTERM)
    read_until(process, r"\[worker-0\] tfdist: SIGTERM received", 60, seen)  # Then resume.
    (tmp_path / "out" / "go").touch()
    output = finish(process, 120, seen)
  finally:
    if process.poll() is None:
      os.killpg(process.pid, signal.SIGKILL)
  assert process.returncode == 42, output[-3000:]
  logs = [(tmp_path / "logs" / f"worker-{i}.log").read_text() for i in (0, 1)]
  saved = {line.split("backup saved at ")[1].split(";")[0] for log in logs
           for line in log.splitlines() if "tfdist: preempted: backup saved at" in line}
  assert saved == {"epoch 2, step 6"}, (saved, logs[0][-2000:])  # Call 3 of 4: 6 of 8 steps.

  process = _launch(tmp_path, config, "reduce_mean", name="logs2")
  output = finish(process, 240, [])
  assert process.returncode == 0, output[-3000:]
  assert "tfdist: resuming at epoch 2, step 14 from" in output, output[-3000:]
  custom_loop.assert_one_devices_weights(tmp_path / "out" / "result.npz")


def _auto_chose_bfloat16(monkeypatch):
  from tfdist.machine import precision
  chosen = precision.Precision("auto", precision.BFLOAT16)
  monkeypatch.setattr(precision, "policy_for", lambda *args, **kwargs: chosen)


def test_a_precision_auto_chose_stays_inside_fit(monkeypatch, tmp_path):
  _auto_chose_bfloat16(monkeypatch)
  x, y = custom_loop.data()
  probe = _Probe()
  saved = tmp_path / "during.keras"
  history = tfdist.fit(_model, x, y, config={"strategy": "default", "training": {
      **BASE, "mixed_precision": "auto"}}, verbose=0, compile=dict(
          optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
      callbacks=[probe, keras.callbacks.ModelCheckpoint(str(saved))])
  assert probe.seen["policy"] == "mixed_bfloat16"  # Trained in what auto chose...
  model = history.model
  assert {layer.dtype_policy.name for layer in model.layers} == {"float32"}  # ...given back.
  assert model.predict(x[:4], verbose=0).dtype == np.float32
  model.save(tmp_path / "after.keras")
  for path in (saved, tmp_path / "after.keras"):
    reloaded = keras.saving.load_model(path)
    assert {layer.dtype_policy.name for layer in reloaded.layers} == {"float32"}, path


def test_a_precision_the_user_chose_is_kept(tmp_path):
  history = tfdist.fit(_model, *custom_loop.data(), config={"strategy": "default", "training": {
      **BASE, "mixed_precision": "bfloat16"}}, verbose=0, compile=dict(
          optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)))
  assert history.model.layers[0].dtype_policy.name == "mixed_bfloat16"


def test_a_precision_auto_chose_stays_inside_the_loop(monkeypatch, tmp_path):
  _auto_chose_bfloat16(monkeypatch)
  loop = tfdist.TrainingLoop({"strategy": "default", "training": {
      **BASE, "mixed_precision": "auto"}})
  with loop.scope():
    model, optimizer = _model(), keras.optimizers.SGD(0.1)
  loop.prepare(model, optimizer)
  during = []
  for _ in loop.epochs(1):
    during.append(model.layers[0].dtype_policy.name)
    model.save(tmp_path / "during.keras")
  assert during == ["mixed_bfloat16"]
  assert model.layers[0].dtype_policy.name == "float32"
  reloaded = keras.saving.load_model(tmp_path / "during.keras")
  assert reloaded.layers[0].dtype_policy.name == "float32"


def _two_outputs():
  keras.utils.set_random_seed(1)
  inputs = keras.Input((8,))
  hidden = keras.layers.Dense(16, activation="relu")(inputs)
  return keras.Model(inputs, {"cls": keras.layers.Dense(3, name="cls")(hidden),
                              "reg": keras.layers.Dense(1, name="reg")(hidden)})


@pytest.mark.parametrize("strategy", ["default", "mirrored", "central_storage"])
def test_per_output_losses_and_metrics_of_uneven_batches_are_means_over_examples(strategy):
  rng = np.random.default_rng(0)
  x, vx = rng.random((100, 8), dtype=np.float32), rng.random((70, 8), dtype=np.float32)
  y = {"cls": rng.integers(0, 3, 100), "reg": rng.random((100, 1), dtype=np.float32)}
  vy = {"cls": rng.integers(0, 3, 70), "reg": rng.random((70, 1), dtype=np.float32)}
  config = {"strategy": strategy, "training": {**BASE, "epochs": 1}}
  if strategy != "default":
    config["devices"] = {"logical_cpus": 2}
  cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  history = tfdist.fit(_two_outputs, x, y, config=config, shuffle=False, verbose=0,
                       validation_data=(vx, vy), compile=dict(
                           optimizer="sgd", loss={"cls": cross_entropy, "reg": "mse"},
                           metrics={"cls": ["accuracy"]}))
  predicted = history.model.predict(vx, verbose=0)  # 70 = 2 x 32 + 6: a partial last batch.
  logs = {k: v[-1] for k, v in history.history.items()}
  want = {"val_cls_loss": float(cross_entropy(vy["cls"], predicted["cls"])),
          "val_reg_loss": float(np.mean((vy["reg"] - predicted["reg"]) ** 2)),
          "val_cls_accuracy": float(np.mean(predicted["cls"].argmax(-1) == vy["cls"]))}
  want["val_loss"] = want["val_cls_loss"] + want["val_reg_loss"]
  for key, value in want.items():
    assert logs[key] == pytest.approx(value, abs=1e-5), key


def test_keras_weighs_a_partial_batchs_output_loss_once():
  """keras_fixes.weigh_output_losses_by_rows is still needed: plain Keras's per-output loss of
  a partial last batch is not a mean over examples. Fails once Keras fixes it: drop the fix."""
  rng = np.random.default_rng(0)
  vx, vy = rng.random((70, 8), dtype=np.float32), {"cls": rng.integers(0, 3, 70),
                                                    "reg": rng.random((70, 1), dtype=np.float32)}
  model = _two_outputs()
  model.compile(optimizer="sgd", loss={"cls": "mse", "reg": "mse"})
  got = model.evaluate(vx, {"cls": np.eye(3)[vy["cls"]], "reg": vy["reg"]}, batch_size=32,
                       verbose=0, return_dict=True)
  predicted = model.predict(vx, verbose=0)
  want = float(np.mean((vy["reg"] - predicted["reg"]) ** 2))
  assert abs(got["reg_loss"] - want) > 1e-4


def test_the_python_apis_bad_input_is_refused_in_one_line():
  x, y = custom_loop.data()
  compile = dict(optimizer="sgd", loss="mse")
  with pytest.raises(tfdist.ModelError, match=r"^model_fn must return a Keras model .* "
                     r"Received: None$"):
    tfdist.fit(lambda: None, x, y, config=DEFAULT, compile=compile)
  with pytest.raises(tfdist.ConfigError, match=r"^batch_size: must be a positive multiple of "
                     r"the 2 replicas .*Received: 63$"):
    tfdist.fit(_model, x, y, config=MIRRORED, batch_size=63, compile=compile)
  unbatched = tf.data.Dataset.from_tensor_slices((x, y))
  with pytest.raises(ValueError, match=r"^train_data: a tf.data.Dataset must yield batches .*"
                     r"Received: a dataset of single examples, element shapes \[\(16,\), \(\)\]$"):
    tfdist.fit(_model, unbatched, config=DEFAULT, compile=compile)
  loop = tfdist.TrainingLoop({"strategy": "default", "training": {"global_batch_size": 32}})
  with pytest.raises(ValueError, match=r"^dataset: a tf.data.Dataset must yield batches"):
    next(loop.run(lambda x, y: 0.0, unbatched))


def test_a_clean_end_prints_no_crash_and_a_real_crash_is_still_shown(tmp_path):
  """The chief works 15 s after training (past the coordination service's 10 s heartbeat
  timeout): its peer waits for it at exit instead of being reported crashed. A worker that
  raises still fails the launch at once, named."""
  process = _launch(tmp_path, MWMS_LOOP, "reduce_mean", env={"CHIEF_END_S": "15"})
  output = finish(process, 240, [])
  assert process.returncode == 0, output[-3000:]
  for log in (tmp_path / "logs").glob("*.log"):
    text = log.read_text()
    assert "The tasks have crashed" not in text and "unhealthy" not in text, text[-2000:]
  assert "The tasks have crashed" not in output
  process = _launch(tmp_path, MWMS_LOOP, "reduce_mean", env={"RAISE_AT": "2:1"},
                    name="crash")
  output = finish(process, 240, [])
  assert process.returncode == 1, output[-3000:]
  assert "worker-1 failed first (exit code 1): the root cause" in output, output[-3000:]
  assert "RuntimeError: a bug in the user's loop" in output


# -- one applier per training key (issue 60): read from the schema and the code's own syntax --

_TRAINING_KEYS = {f"training.{name}" for name in
                  __import__("tfdist.config.schema", fromlist=["TrainingConfig"])
                  .TrainingConfig.__dataclass_fields__}
_TFDIST = __import__("pathlib").Path(tfdist.__file__).parent


def _keys_read(tree) -> set:
  """The `training.*` keys a syntax tree reads: `<x>.training.<key>`, `training.<key>`
  through a name bound to a config's training section, or the batch keys through
  `batch_sizes(<x>.training, ...)` (config/batch.py: the batch's arithmetic, below training)."""
  import ast
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) \
        == "batch_sizes" and any(getattr(a, "attr", None) == "training" for a in node.args):
      found |= {"training.global_batch_size", "training.per_replica_batch_size"}
    if isinstance(node, ast.Attribute) and f"training.{node.attr}" in _TRAINING_KEYS:
      holder = node.value
      if (isinstance(holder, ast.Attribute) and holder.attr == "training") or \
          (isinstance(holder, ast.Name) and holder.id == "training"):
        found.add(f"training.{node.attr}")
  return found


def test_each_training_key_has_one_applier_and_only_it_reads_the_key():
  import ast
  assert set(settings.APPLIERS) == _TRAINING_KEYS, set(settings.APPLIERS) ^ _TRAINING_KEYS
  tree = ast.parse((_TFDIST / "training" / "settings.py").read_text())
  readers = {}
  for function in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
    for key in _keys_read(function):
      readers.setdefault(key, set()).add(function.name)
  for key, applier in settings.APPLIERS.items():
    assert callable(getattr(settings, applier)), applier
    assert readers.get(key) == {applier}, (key, readers.get(key))


@pytest.mark.parametrize("module, path", [("fit.py", honoured.FIT), ("loop.py", honoured.LOOP)])
def test_every_training_path_calls_each_applier_and_reads_no_training_key_itself(module, path):
  """`tfdist.fit` runs the parameter-server loop and a split model too; the loop runs under
  parameter servers as well: each calls every applier of a key its path does not refuse."""
  import ast
  tree = ast.parse((_TFDIST / "training" / module).read_text())
  called = {node.func.attr for node in ast.walk(tree) if isinstance(node, ast.Call) and
            isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) and
            node.func.value.id == "settings"}
  needed = {applier for key, applier in settings.APPLIERS.items()
            if path not in honoured.DECISIONS[key].refused}
  assert needed <= called, needed - called
  rooms = [*(_TFDIST / "training").glob("*.py"), _TFDIST / "parallel" / "split_model.py",
           _TFDIST / "parallel" / "hybrid.py"]
  reading = {p.name: _keys_read(ast.parse(p.read_text())) for p in rooms
             if p.name != "settings.py"}
  assert {name: keys for name, keys in reading.items() if keys} == {}
