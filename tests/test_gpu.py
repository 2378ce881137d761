"""On a machine with 1 to 8 GPUs (`pytest -m gpu`; skipped elsewhere): two local workers get
their GPUs (one shared, or one each), a model compiled with Keras's defaults splits over two logical GPUs and trains, mirrored
runs over logical GPUs (ZeRO stages 2 and 3 too), and `auto` precision is measured on the
GPU. Every run goes through the
launcher with the machine's GPUs given back (the rest of the suite hides them). Each program
prints where each weight lives (which would read CPU without a GPU), and the training is
compared with plain Keras on this process's CPU."""

import re
import sys

import numpy as np
import pytest

from tests.conftest import GPUS, PROGRAMS, gpu_env
from tests.launching import finish, start_launch
from tests.test_user_script import placed, plain_keras_weights

pytestmark = pytest.mark.gpu
TRAINING = "training: {global_batch_size: 64, epochs: 3}\n"
FLOAT32 = "training: {global_batch_size: 64, epochs: 3, mixed_precision: 'off'}\n"
TF32 = 2e-2  # TensorFloat-32 matmuls (TensorFlow's default on compute capability >= 8.0).


def assert_plain_keras(out):
  saved = np.load(out / "result.npz")
  for i, want in enumerate(plain_keras_weights()):
    np.testing.assert_allclose(saved[f"w{i}"], want, atol=TF32)


def launch(tmp_path, config, *program):
  (tmp_path / "config.yaml").write_text(config)
  process = start_launch(str(tmp_path / "config.yaml"), "--logs", str(tmp_path / "logs"),
                         "--verbose", "--", sys.executable, *program, env=gpu_env())
  output = finish(process, 300, [])
  assert process.returncode == 0, output[-3000:]
  return output


def test_two_local_workers_get_their_gpus_and_train(tmp_path):
  """One GPU: both workers share it, growing their memory; 2 to 8: each worker its own. Each
  worker's weights live on its GPU and end as plain Keras's."""
  import tfdist
  from tfdist.launch.gpus import host_shares
  config_text = "cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n" + FLOAT32
  output = launch(tmp_path, config_text, str(PROGRAMS / "user_script.py"), str(tmp_path / "out"))
  config = tfdist.load_config(tmp_path / "config.yaml", environ={})
  shares = host_shares(config, GPUS).values()
  for share in shares:
    assert f"CUDA_VISIBLE_DEVICES={','.join(share.devices)}" in output, output[-3000:]
  assert ("TF_FORCE_GPU_ALLOW_GROWTH=true" in output) == any(s.shared for s in shares)
  for task in ("worker-0", "worker-1"):  # Each process sees its own GPU(s) from GPU:0.
    where = set(re.findall(rf"PLACED {task} \S+ \S+device:(\w+:\d+)", output))
    assert where == {"GPU:0"}, (task, where)
  assert_plain_keras(tmp_path / "out")


def test_a_default_compiled_model_splits_over_two_logical_gpus_and_trains(tmp_path):
  output = launch(tmp_path, "devices: {logical_gpus: 2}\n",
                  str(PROGRAMS / "split_default_compiled.py"))
  assert "tfdist: jit_compile off for the model split over devices" in output
  first, last = map(float, re.search(r"LOSSES (\S+) (\S+)", output).groups())
  plain = [float(v) for v in re.search(r"PLAIN_LOSSES (\S+) (\S+)", output).groups()]
  assert last < first
  np.testing.assert_allclose([first, last], plain, rtol=5e-2)  # One CPU, plain Keras.
  placed = set(re.findall(r"PLACED \S+ (\S+)", output))
  assert {d.split("device:")[-1] for d in placed} == {"GPU:0", "GPU:1"}, placed


def test_mirrored_over_two_logical_gpus_trains_as_plain_keras(tmp_path):
  output = launch(tmp_path, "strategy: mirrored\ndevices: {logical_gpus: 2}\n" + FLOAT32,
                  str(PROGRAMS / "user_script.py"), str(tmp_path / "out"))
  assert "mirrored, 2 replicas" in output
  where = placed(output)
  assert len(where) == 4 and all(d == {"GPU:0", "GPU:1"} for d in where.values()), where
  assert_plain_keras(tmp_path / "out")


@pytest.mark.parametrize("sharded", ["zero_stage: 2", "zero_stage: 3"], ids=["stage_2", "stage_3"])
def test_zero_stages_over_two_logical_gpus_train_as_plain_keras(tmp_path, sharded):
  """ZeRO stages 2 and 3 (issue 62) on GPUs: the gradients' reduce-scatter (an all-to-all) and
  stage 3's all-reduced buckets run on the GPUs' collectives, and the weights are plain
  Keras's."""
  training = FLOAT32.replace("}", f", {sharded}}}")
  output = launch(tmp_path, "strategy: mirrored\ndevices: {logical_gpus: 2}\n" + training,
                  str(PROGRAMS / "user_script.py"), str(tmp_path / "out"))
  assert "weights sharded" in output or sharded != "zero_stage: 3", output[-3000:]
  where = placed(output)
  assert all(d == {"GPU:0", "GPU:1"} for d in where.values()), where
  assert_plain_keras(tmp_path / "out")


def test_auto_precision_is_measured_on_the_gpu(tmp_path):
  output = launch(tmp_path, TRAINING, str(PROGRAMS / "user_script.py"), str(tmp_path / "out"))
  start = next(line for line in output.splitlines() if "tfdist: default" in line)
  # bfloat16 on compute capability >= 8.0, float16 (loss-scaled) on 7.x: each measured.
  assert re.search(r"b?float16 measured [\d.]+x float32 on .*\(cc \d+\.\d+\)", start), start


def test_a_causal_lm_too_big_for_one_logical_gpu_generates_split_over_two(tmp_path):
  """24 blocks of width 1024 (335 M parameters, 1.3 GiB of float32 weights) over two logical
  GPUs of 1100 MiB: neither holds the model, each holds its half; peaks against the plan."""
  output = launch(tmp_path, "devices: {logical_gpus: 2, gpu_memory: 1100}\n",
                  str(PROGRAMS / "generate_split.py"), "24", "1024")
  planned = [float(v) for v in re.search(r"PLAN (\S+) (\S+)", output).groups()]
  peaks = dict(re.findall(r"PEAK (\S+) (\S+)", output))
  assert set(peaks) == {"GPU:0", "GPU:1"} and max(planned) < 1100, output[-3000:]
  for peak in map(float, peaks.values()):
    assert 0.5 * max(planned) < peak <= 1100, (planned, peaks)
  assert re.search(r"TOKENS 1024", output), output[-3000:]
