"""Keras's own distribution API on TensorFlow through tfdist (issue 36): a script that sets
`keras.distribution.DataParallel` and calls Keras's own `fit`, `evaluate` and `predict` trains
data-parallel once `tfdist.use_keras_distribution()` is called, over 2 logical CPUs and over 2
MultiWorkerMirrored processes, with plain Keras's one-device results; `ModelParallel` splits the
Dense kernels its layout map lays out over the "model" devices and trains as the unsplit model;
what tfdist does not run is refused in one line."""

import json
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.testing.local_cluster import run_everywhere
from tests.conftest import PROGRAMS, REPO
from tests.programs import equivalence_case as case
from tests.test_fit import assert_same_training

pytestmark = pytest.mark.usefixtures("two_cpus")


@pytest.fixture
def keras_distribution():
  """Leaves no distribution and no process-wide strategy behind."""
  yield keras.distribution
  keras.distribution.set_distribution(None)
  tf.distribute.experimental_set_strategy(None)


def test_data_parallel_over_two_devices_trains_as_one_device(keras_distribution):
  reference = case.train_plain("plain")  # Plain Keras on one device, before the switch.
  keras_distribution.set_distribution(keras_distribution.DataParallel())
  strategy = tfdist.use_keras_distribution()
  assert isinstance(strategy, tf.distribute.MirroredStrategy)
  assert strategy.extended.worker_devices == ("/job:localhost/replica:0/task:0/device:CPU:0",
                                              "/job:localhost/replica:0/task:0/device:CPU:1")
  model = case.model_fn()
  kernel = model.layers[0].kernel.value
  assert [v.device for v in kernel.values] == list(strategy.extended.worker_devices)
  model.compile(**case.compile_args(), steps_per_execution=1)
  x, y = case.data()
  history = case.fit_plain(model, x, y, case.EPOCHS)
  result = {"history": history,
            "evaluate": model.evaluate(x, y, batch_size=case.GLOBAL_BATCH, verbose=0),
            "predict": model.predict(x[:40], batch_size=case.GLOBAL_BATCH, verbose=0),
            "weights": model.get_weights(), "predict_dtype": "float32",
            "compute_dtype": "float32"}
  assert_same_training(result, reference, "plain")
  np.testing.assert_allclose(kernel.values[0].numpy(), kernel.values[1].numpy())


def test_data_parallel_over_two_processes_trains_as_one_device(tmp_path):
  config = tmp_path / "mwms.yaml"
  config.write_text("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
  processes = run_everywhere(config, [sys.executable, str(PROGRAMS / "keras_distribution.py")],
                             tmp_path, 300, env={"PYTHONPATH": str(REPO), "TFDIST_PREPARE": "1"})
  reference = case.train_plain("plain")
  for p in processes:
    assert p.process.returncode == 0, p.output()[-3000:]
    lines = p.output().splitlines()
    assert "COPIES 1" in lines  # Each process holds its own device's copy.
    result = json.loads(next(l for l in lines if l.startswith("RESULT "))[len("RESULT "):])
    assert_same_training(result, reference, "plain")


def test_data_parallel_launched_with_two_logical_cpus_trains_as_one_device(tmp_path):
  """One launched process whose config splits the CPU: import tfdist applies the devices, the
  mesh finds 2, and the switch trains data-parallel (2 copies) with one device's results."""
  from tests.launching import run_launch
  code, output = run_launch(tmp_path, "devices: {logical_cpus: 2}\n", "keras_distribution.py")
  assert code == 0, output[-3000:]
  assert "[local] COPIES 2" in output
  line = next(l for l in output.splitlines() if l.startswith("[local] RESULT "))
  assert_same_training(json.loads(line[len("[local] RESULT "):]), case.train_plain("plain"),
                       "plain")


def _dense_stack():
  init = keras.initializers.GlorotUniform
  return keras.Sequential([
      keras.Input((8,)),
      keras.layers.Dense(16, activation="relu", kernel_initializer=init(1), name="up"),
      keras.layers.Dense(6, activation="relu", kernel_initializer=init(2), name="down"),
      keras.layers.Dense(2, kernel_initializer=init(3), name="head")])


def _model_parallel(distribution, layouts_given):
  mesh = distribution.DeviceMesh((1, 2), ["batch", "model"], ["cpu:0", "cpu:1"])
  layouts = distribution.LayoutMap(mesh)
  for key, axes in layouts_given.items():
    layouts[key] = axes
  distribution.set_distribution(distribution.ModelParallel(layout_map=layouts,
                                                           batch_dim_name="batch"))


def test_model_parallel_splits_the_laid_out_kernels_and_trains_as_the_unsplit_model(
    keras_distribution, tmp_path):
  x, y = case.data()
  whole = _dense_stack()
  whole.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.5), loss="mse")
  targets = np.eye(2, dtype="float32")[y]
  whole_before = whole.predict(x, verbose=0)
  whole.fit(x, targets, batch_size=32, epochs=2, shuffle=False, verbose=0)
  _model_parallel(keras_distribution, {".*/up/kernel": (None, "model"),
                                       ".*/up/bias": ("model",),
                                       ".*/down/kernel": ("model", None)})
  tfdist.use_keras_distribution()
  model = _dense_stack()
  up, down, head = model.layers
  assert [k.value.device.split("/")[-1] for k in up.tfdist_split[2]] == ["device:CPU:0",
                                                                          "device:CPU:1"]
  assert [tuple(k.shape) for k in up.tfdist_split[2]] == [(8, 8), (8, 8)]  # Columns.
  assert [tuple(k.shape) for k in down.tfdist_split[2]] == [(8, 6), (8, 6)]  # Rows.
  assert not hasattr(head, "tfdist_split")  # Not in the map: whole.
  np.testing.assert_allclose(model.predict(x, verbose=0), whole_before, atol=1e-6)
  model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.5), loss="mse")
  model.fit(x, targets, batch_size=32, epochs=2, shuffle=False, verbose=0)
  slots = [v for v in model.optimizer.variables if "momentum" in v.path or "_kernel_1" in
           v.path]
  assert any(v.value.device.endswith("CPU:1") for v in slots)  # Beside their kernel slice.
  np.testing.assert_allclose(model.predict(x, verbose=0), whole.predict(x, verbose=0),
                             atol=1e-5)
  model.save(tmp_path / "split.keras")
  keras_distribution.set_distribution(None)
  plain = keras.models.load_model(tmp_path / "split.keras")  # An ordinary Dense stack.
  assert [type(l).__name__ for l in plain.layers] == ["Dense"] * 3
  assert [w.shape for w in plain.get_weights()] == [w.shape for w in whole.get_weights()]
  np.testing.assert_allclose(plain.predict(x, verbose=0), whole.predict(x, verbose=0),
                             atol=1e-5)


def test_what_tfdist_does_not_run_is_refused_in_one_line(keras_distribution):
  with pytest.raises(tfdist.ConfigError, match=r"^keras.distribution: no distribution is set"):
    tfdist.use_keras_distribution()
  _model_parallel(keras_distribution, {".*/up/kernel": ("model", "model")})
  with pytest.raises(tfdist.ConfigError) as refused:
    tfdist.use_keras_distribution()
  assert str(refused.value) == (
      "LayoutMap['.*/up/kernel']: is a layout tfdist does not run on TensorFlow: Dense kernels as "
      "(None, \"model\") (columns) or (\"model\", None) (rows), their biases as (\"model\",) or "
      "(None,). Received: ('model', 'model')")
  _model_parallel(keras_distribution, {".*/up/kernel": ("model", None),
                                       ".*/up/bias": ("model",)})
  tfdist.use_keras_distribution()
  with pytest.raises(tfdist.ConfigError) as refused:
    _dense_stack()  # A row-split Dense's bias is whole: a sharded bias is not honoured.
  assert str(refused.value).startswith("LayoutMap[sequential") and str(refused.value).endswith(
      "/up/bias]: is not the layout of a row-split Dense's bias, which is (None,). "
      "Received: ('model',)"), str(refused.value)
  _model_parallel(keras_distribution, {"embeddings": (None, "model")})
  with pytest.raises(tfdist.ConfigError, match=r"^LayoutMap\['embeddings'\]: is a layout"):
    tfdist.use_keras_distribution()
  _model_parallel(keras_distribution, {".*attention/kernel": (None, "model")})
  tfdist.use_keras_distribution()
  inputs = keras.Input((8,))
  with pytest.raises(tfdist.ConfigError, match=r"^LayoutMap: lays out a weight tfdist does not "
                     r"split on TensorFlow \(only Dense kernels are\): attention/kernel. "
                     r"Received: \(None, 'model'\)"):
    keras.layers.EinsumDense("ab,bc->ac", (4,), name="attention")(inputs)
  mesh = keras_distribution.DeviceMesh((2,), ["batch"], ["cpu:0", "cpu:7"])
  keras_distribution.set_distribution(keras_distribution.DataParallel(device_mesh=mesh))
  with pytest.raises(tfdist.ConfigError, match=r"device_mesh: must name this process's devices "
                     r"\(cpu:0, cpu:1\).*Received: \['cpu:7'\]"):
    tfdist.use_keras_distribution()


PATHS = {
    "tfdist.fit": ({}, "tfdist.fit"),
    "the parameter-server loop": ({"cluster": {"chief": 1, "worker": 1, "ps": 1},
                                   "strategy": "parameter_server"},
                                  "tfdist.fit under the parameter-server loop"),
    "a split model": ({"parallel": {"stages": "balanced"}}, "tfdist.fit under a split model"),
    "tfdist.TrainingLoop": ({}, "tfdist.TrainingLoop"),
    "tfdist.TrainingLoop, parameter servers": (
        {"cluster": {"chief": 1, "worker": 1, "ps": 1}, "strategy": "parameter_server"},
        "tfdist.TrainingLoop under the parameter-server loop"),
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("switched", [False, True])
def test_every_training_path_refuses_a_keras_distribution_in_one_line(keras_distribution, path,
                                                                       switched):
  """tfdist's paths take their strategy from the config: a keras.distribution beside it, switched
  on or not, would be a second one (a no-op, or a clash), so each path names the key instead."""
  keras_distribution.set_distribution(keras_distribution.DataParallel())
  if switched:
    tfdist.use_keras_distribution()
  config, named = PATHS[path]
  config = {**config, "training": {"global_batch_size": 32}}
  with pytest.raises(tfdist.ConfigError) as refused:
    if path.startswith("tfdist.TrainingLoop"):
      tfdist.TrainingLoop(config)
    else:
      tfdist.fit(_dense_stack, *case.data(), config=config)
  assert str(refused.value) == (
      f"keras.distribution: is set, and {named} takes its strategy from the config's strategy: "
      "section: unset it with keras.distribution.set_distribution(None), or train with Keras's "
      "own model.fit after tfdist.use_keras_distribution(). Received: 'DataParallel'")


def test_tfdist_env_says_keras_distribution_does_nothing_alone_and_names_the_switch():
  from tfdist.monitoring import environment
  line = next(l for l in environment.render(environment.gather()).splitlines()
              if l.startswith("keras_distribution: "))
  assert "does nothing by itself on the TensorFlow backend" in line
  assert "tfdist.use_keras_distribution()" in line


def test_distribute_tensor_answers_as_on_jax(keras_distribution):
  from tfdist.training import keras_distribution as switch
  # Keras's TensorFlow backend has none of its own (keras-team/keras#18473): when it has, this
  # fails, and the switch stops giving tfdist's.
  assert switch._upstream_distribute_tensor() is None
  keras_distribution.set_distribution(keras_distribution.DataParallel())
  strategy = tfdist.use_keras_distribution()
  mesh = keras_distribution.distribution().device_mesh
  assert keras_distribution.list_devices() == ["cpu:0", "cpu:1"]
  batch = tf.reshape(tf.range(8, dtype=tf.float32), (4, 2))
  sharded = keras_distribution.distribute_tensor(
      batch, keras_distribution.TensorLayout(("batch", None), mesh))
  assert [v.device for v in sharded.values] == ["/job:localhost/replica:0/task:0/device:CPU:0",
                                                "/job:localhost/replica:0/task:0/device:CPU:1"]
  np.testing.assert_array_equal(np.concatenate([v.numpy() for v in sharded.values]), batch)
  replicated = keras_distribution.distribute_tensor(
      batch, keras_distribution.TensorLayout((None, None), mesh))
  assert all(np.array_equal(v.numpy(), batch) for v in replicated.values)
  seen = strategy.run(lambda x: keras_distribution.distribute_tensor(
      x, keras_distribution.TensorLayout(("batch", None), mesh)) * 1.0, args=(sharded,))
  np.testing.assert_array_equal(np.concatenate([v.numpy() for v in seen.values]), batch)
  with pytest.raises(tfdist.UnsupportedError, match=r"^keras.distribution.distribute_tensor: "
                     r"lays out axes \(None, 'batch'\)"):
    keras_distribution.distribute_tensor(
        batch, keras_distribution.TensorLayout((None, "batch"), mesh))
  with pytest.raises(tfdist.ConfigError, match=r"^keras.distribution.distribute_tensor: must "
                     r"divide among the 2 replicas.*Received: 3$"):
    keras_distribution.distribute_tensor(
        batch[:3], keras_distribution.TensorLayout(("batch", None), mesh))


def _functional_stack():
  init = keras.initializers.GlorotUniform
  inputs = keras.Input((8,))
  hidden = keras.layers.Dense(16, activation="relu", kernel_initializer=init(1), name="up")(inputs)
  hidden = keras.layers.Dense(6, activation="relu", kernel_initializer=init(2),
                              name="down")(hidden)
  return keras.Model(inputs, keras.layers.Dense(2, kernel_initializer=init(3),
                                                name="head")(hidden))


@pytest.mark.parametrize("build", [_dense_stack, _functional_stack],
                         ids=["sequential", "functional"])
def test_a_layout_key_matching_no_weight_is_named_and_the_docs_keys_split_both_model_kinds(
    keras_distribution, build):
  """The docs' keys (`"(.*/)?up/kernel"`) split a Sequential (`sequential/up/kernel`) and a
  functional model (`up/kernel`) alike, and train as the unsplit model; a key of neither kind's
  paths (`".*/up/kernel"` for a functional model, a typo for both) is refused at fit, naming
  it, instead of training unsplit in silence."""
  x, y = case.data()
  targets = np.eye(2, dtype="float32")[y]
  whole = build()
  whole.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
  whole.fit(x, targets, batch_size=32, epochs=1, shuffle=False, verbose=0)
  _model_parallel(keras_distribution, {"(.*/)?up/kernel": (None, "model"),
                                       "(.*/)?down/kernel": ("model", None)})
  tfdist.use_keras_distribution()
  model = build()
  assert [hasattr(layer, "tfdist_split") for layer in model.layers if layer.weights] == \
      [True, True, False]
  model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
  model.fit(x, targets, batch_size=32, epochs=1, shuffle=False, verbose=0)
  np.testing.assert_allclose(model.predict(x, verbose=0), whole.predict(x, verbose=0),
                             atol=1e-5)
  missing = ".*/up/kernel" if build is _functional_stack else ".*/upp/kernel"
  _model_parallel(keras_distribution, {missing: (None, "model")})
  tfdist.use_keras_distribution()
  unsplit = build()
  unsplit.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
  with pytest.raises(tfdist.ConfigError) as refused:
    unsplit.fit(x, targets, batch_size=32, epochs=1, verbose=0)
  assert str(refused.value).startswith(
      f"LayoutMap[{missing!r}]: matches no weight of the model, so nothing is laid out by it"), \
      str(refused.value)
  assert "up/kernel" in str(refused.value)
