"""On a machine with a GPU (`pytest -m gpu`; skipped elsewhere): two local workers share one
GPU, a model compiled with Keras's defaults splits over two logical GPUs and trains, mirrored
runs over logical GPUs, and `auto` precision is measured on the GPU. Every run goes through the
launcher with the machine's GPUs given back (the rest of the suite hides them)."""

import re
import sys

import pytest

from tests.conftest import PROGRAMS, gpu_env
from tests.launching import finish, start_launch

pytestmark = pytest.mark.gpu
TRAINING = "training: {global_batch_size: 64, epochs: 3}\n"


def launch(tmp_path, config, *program):
  (tmp_path / "config.yaml").write_text(config)
  process = start_launch(str(tmp_path / "config.yaml"), "--logs", str(tmp_path / "logs"),
                         "--verbose", "--", sys.executable, *program, env=gpu_env())
  output = finish(process, 300, [])
  assert process.returncode == 0, output[-3000:]
  return output


def test_two_local_workers_share_one_gpu_and_train(tmp_path):
  output = launch(tmp_path, "cluster: {worker: 2}\n" + TRAINING,
                  str(PROGRAMS / "user_script.py"), str(tmp_path / "out"))
  assert "CUDA_VISIBLE_DEVICES=0" in output and "TF_FORCE_GPU_ALLOW_GROWTH=true" in output
  assert "out of memory" not in output and "final loss" in output


def test_a_default_compiled_model_splits_over_two_logical_gpus_and_trains(tmp_path):
  output = launch(tmp_path, "devices: {logical_gpus: 2}\n",
                  str(PROGRAMS / "split_default_compiled.py"))
  assert "tfdist: jit_compile off for the model split over devices" in output
  first, last = map(float, re.search(r"LOSSES (\S+) (\S+)", output).groups())
  assert last < first
  placed = set(re.findall(r"PLACED \S+ (\S+)", output))
  assert {d.split("device:")[-1] for d in placed} == {"GPU:0", "GPU:1"}, placed


def test_mirrored_over_two_logical_gpus_trains(tmp_path):
  output = launch(tmp_path, "strategy: mirrored\ndevices: {logical_gpus: 2}\n" + TRAINING,
                  str(PROGRAMS / "user_script.py"), str(tmp_path / "out"))
  assert "mirrored, 2 replicas" in output and "final loss" in output


def test_auto_precision_is_measured_on_the_gpu(tmp_path):
  output = launch(tmp_path, TRAINING, str(PROGRAMS / "user_script.py"), str(tmp_path / "out"))
  start = next(line for line in output.splitlines() if "tfdist: default" in line)
  assert re.search(r"bfloat16 measured [\d.]+x float32 on .*\(cc \d+\.\d+\)", start), start
