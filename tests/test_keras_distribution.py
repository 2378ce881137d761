"""Keras's own distribution API on TensorFlow through tfdist (issue 36): a script that sets
`keras.distribution.DataParallel` and calls Keras's own `fit`, `evaluate` and `predict` trains
data-parallel once `tfdist.use_keras_distribution()` is called, over 2 logical CPUs and over 2
MultiWorkerMirrored processes, with plain Keras's one-device results; what tfdist does not run
is refused in one line."""

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


def test_what_tfdist_does_not_run_is_refused_in_one_line(keras_distribution):
  with pytest.raises(tfdist.ConfigError, match=r"^keras.distribution: no distribution is set"):
    tfdist.use_keras_distribution()
  devices = keras_distribution.list_devices()
  mesh = keras_distribution.DeviceMesh((1, 2), ["batch", "model"], devices)
  layouts = keras_distribution.LayoutMap(mesh)
  layouts["dense.*kernel"] = (None, "model")
  keras_distribution.set_distribution(keras_distribution.ModelParallel(layout_map=layouts,
                                                                       batch_dim_name="batch"))
  with pytest.raises(tfdist.UnsupportedError) as refused:
    tfdist.use_keras_distribution()
  assert str(refused.value) == (
      "keras.distribution.ModelParallel: its layouts {'dense.*kernel': (None, 'model')} are not "
      "run on TensorFlow by tfdist; split the model with the config's parallel: section or "
      "tfdist.parallel.split, or use DataParallel")
  mesh = keras_distribution.DeviceMesh((2,), ["batch"], ["cpu:0", "cpu:7"])
  keras_distribution.set_distribution(keras_distribution.DataParallel(device_mesh=mesh))
  with pytest.raises(tfdist.ConfigError, match=r"device_mesh: must name this process's devices "
                     r"\(cpu:0, cpu:1\).*Received: \['cpu:7'\]"):
    tfdist.use_keras_distribution()


def test_tfdist_env_says_keras_distribution_does_nothing_alone_and_names_the_switch():
  from tfdist.monitoring import environment
  line = next(l for l in environment.render(environment.gather()).splitlines()
              if l.startswith("keras_distribution: "))
  assert "does nothing by itself on the TensorFlow backend" in line
  assert "tfdist.use_keras_distribution()" in line
