"""A script that enables TensorFlow's op determinism trains under every synchronous strategy
through `tfdist launch`, to plain Keras's one-device weights; monitoring that needs
`tf.timestamp` (which determinism refuses) is switched off with one line instead of crashing
the run."""

import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import PROGRAMS
from tests.launching import ENV, finish, start_launch

TRAINING = "training: {global_batch_size: 32, epochs: 2, mixed_precision: 'off'}\n"
CONFIGS = {
    "default": "",
    "mirrored": "strategy: mirrored\ndevices: {logical_cpus: 2}\n",
    "central_storage": "strategy: central_storage\ndevices: {logical_cpus: 2}\n",
    "multi_worker_mirrored": "cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n",
}


def launch(tmp_path, strategy, extra=""):
  out = tmp_path / strategy
  out.mkdir()
  (out / "config.yaml").write_text(CONFIGS[strategy] + TRAINING + extra)
  process = start_launch(str(out / "config.yaml"), "--logs", str(out / "logs"), "--", sys.executable,
                         str(PROGRAMS / "deterministic.py"), str(out))
  output = finish(process, 240, [])
  assert process.returncode == 0, output[-3000:]
  return output, [np.load(out / "weights.npz")[f"arr_{i}"] for i in range(4)]


@pytest.fixture(scope="module")
def one_device(tmp_path_factory):
  """Plain Keras's weights on one device (`model.fit`, op determinism on), no tfdist."""
  out = tmp_path_factory.mktemp("plain")
  subprocess.run([sys.executable, str(PROGRAMS / "deterministic.py"), str(out), "plain"],
                 env=ENV, check=True, timeout=240, capture_output=True)
  return [np.load(out / "weights.npz")[f"arr_{i}"] for i in range(4)]


@pytest.mark.parametrize("strategy", ["default", "mirrored", "central_storage",
                                      "multi_worker_mirrored"])
def test_a_deterministic_script_trains_as_one_device(tmp_path, one_device, strategy):
  _, weights = launch(tmp_path, strategy)
  for got, want in zip(weights, one_device, strict=True):
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_the_step_time_split_is_switched_off_in_one_line(tmp_path, one_device):
  output, weights = launch(tmp_path, "mirrored",
                           f"tensorboard: {{log_dir: {tmp_path / 'tb'}}}\n")
  assert output.count("op determinism is on: the step-time split") == 1, output[-3000:]
  assert "Timestamp cannot be called" not in output
  for got, want in zip(weights, one_device, strict=True):
    np.testing.assert_allclose(got, want, atol=1e-5)
