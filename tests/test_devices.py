"""Devices on machines with GPUs, tested as data on any machine: which GPUs each local task gets
(the launch plan's CUDA_VISIBLE_DEVICES), Slurm's local ids, `devices.logical_cpus` hiding the
GPUs it would otherwise leave in use, the jit_compile rule of a split model, and the devices
section's refusals."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfdist
from tfdist.config import DevicesConfig
from tfdist.errors import ConfigError, ModelError
from tfdist.launch import plan
from tfdist.launch.gpus import GpuShare, share_gpus, slurm_local_task
from tfdist.machine import facts

pytestmark = pytest.mark.usefixtures("two_cpus")  # TensorFlow starts with the suite's devices.
GPU2, GPU4, GPU8 = ["0", "1"], ["0", "1", "2", "3"], [str(i) for i in range(8)]


@pytest.mark.parametrize("gpus,count,per_task,expected", [
    (GPU4, 4, None, [GpuShare(("0",)), GpuShare(("1",)), GpuShare(("2",)), GpuShare(("3",))]),
    (GPU2, 4, None, [GpuShare(("0",), True), GpuShare(("1",), True),
                     GpuShare(("0",), True), GpuShare(("1",), True)]),
    (GPU8, 1, None, [GpuShare(tuple(GPU8))]),
    (GPU8, 4, None, [GpuShare(("0", "1")), GpuShare(("2", "3")), GpuShare(("4", "5")),
                     GpuShare(("6", "7"))]),
    (GPU8, 3, 2, [GpuShare(("0", "1")), GpuShare(("2", "3")), GpuShare(("4", "5"))]),
    (GPU4, 2, 0, [GpuShare(()), GpuShare(())]),
    ([], 4, None, [GpuShare(())] * 4),
    (["5", "7"], 2, None, [GpuShare(("5",)), GpuShare(("7",))]),  # Slurm's or a pod's own ids.
])
def test_each_local_task_gets_its_share_of_the_hosts_gpus(gpus, count, per_task, expected):
  assert [share_gpus(gpus, i, count, per_task) for i in range(count)] == expected


def test_more_gpus_per_task_than_the_host_has_is_refused():
  with pytest.raises(ConfigError, match=r"devices.gpus_per_task: asks for 2 GPU\(s\) for each of "
                     r"this host's 4 GPU task\(s\), but it has 4 \(0,1,2,3\). Received: 2"):
    share_gpus(GPU4, 0, 4, per_task=2)


def env_of(launch_plan):
  return {p.name: dict(p.env) for p in launch_plan.processes}


def test_the_launch_plan_gives_each_task_its_gpus_and_shared_ones_memory_growth(tmp_path):
  config = tfdist.load_config({"cluster": {"worker": 4}}, environ={})
  env = env_of(plan.plan_launch(config, "c.yaml", ["python", "t.py"], log_dir=str(tmp_path),
                                ports=[1001, 1002, 1003, 1004], gpus=GPU2))
  assert [env[f"worker-{i}"]["CUDA_VISIBLE_DEVICES"] for i in range(4)] == ["0", "1", "0", "1"]
  assert all(env[f"worker-{i}"]["TF_FORCE_GPU_ALLOW_GROWTH"] == "true" for i in range(4))
  env = env_of(plan.plan_launch(config, "c.yaml", ["python", "t.py"], log_dir=str(tmp_path),
                                ports=[1001, 1002, 1003, 1004], gpus=GPU4))
  assert [env[f"worker-{i}"]["CUDA_VISIBLE_DEVICES"] for i in range(4)] == ["0", "1", "2", "3"]
  assert "TF_FORCE_GPU_ALLOW_GROWTH" not in env["worker-0"]  # Its own GPU: TensorFlow's default.
  env = env_of(plan.plan_launch(config, "c.yaml", ["python", "t.py"], log_dir=str(tmp_path),
                                ports=[1001, 1002, 1003, 1004], gpus=[]))
  assert "CUDA_VISIBLE_DEVICES" not in env["worker-0"]  # A machine without GPUs: untouched.


def test_a_parameter_servers_ps_gets_no_gpu_and_workers_share_the_rest(tmp_path):
  config = tfdist.load_config({"cluster": {"chief": 1, "worker": 2, "ps": 1},
                               "strategy": "parameter_server",
                               "devices": {"gpu_memory": 2048}}, environ={})
  env = env_of(plan.plan_launch(config, "c.yaml", ["python", "t.py"], log_dir=str(tmp_path),
                                ports=[1001, 1002, 1003, 1004], gpus=GPU2))
  assert env["ps-0"]["CUDA_VISIBLE_DEVICES"] == ""
  assert [env[t]["CUDA_VISIBLE_DEVICES"] for t in ("chief-0", "worker-0", "worker-1")] == \
      ["0", "1", "0"]
  # A memory limit in MiB is applied by each task itself, not by TensorFlow's growth switch.
  assert not any("TF_FORCE_GPU_ALLOW_GROWTH" in e for e in env.values())


def test_a_slurm_task_gets_its_share_by_its_local_id(tmp_path):
  environ = {"SLURM_LOCALID": "1", "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": "2,1"}
  assert slurm_local_task(environ) == (1, 2)
  assert slurm_local_task({**environ, "SLURM_NODEID": "1"}) == (1, 1)
  assert slurm_local_task({**environ, "SLURM_GPUS_PER_TASK": "1"}) is None  # Slurm bound them.
  config = tfdist.load_config({"cluster": {"worker": ["a:1", "a:2", "b:1"]}}, environ={})
  only = config.cluster.tasks()[1]
  env = env_of(plan.plan_launch(config, "c.yaml", ["python", "t.py"], log_dir=str(tmp_path),
                                task=only, gpus=GPU4, local_task=(1, 2)))
  assert env["worker-1"]["CUDA_VISIBLE_DEVICES"] == "2,3"


def test_visible_gpus_follow_cuda_visible_devices_else_the_driver(tmp_path):
  assert facts.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []
  assert facts.visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == []
  assert facts.visible_gpus({"CUDA_VISIBLE_DEVICES": "3, 1"}) == ["3", "1"]
  for name in ("0000:00:1e.0", "0000:00:1f.0"):
    (tmp_path / name).mkdir()
  assert facts.visible_gpus({}, proc=tmp_path) == ["0", "1"]
  assert facts.visible_gpus({}, proc=tmp_path / "none") == []


def test_logical_cpus_on_a_machine_with_gpus_hides_them(monkeypatch):
  fake_gpu = tf.config.PhysicalDevice("/physical_device:GPU:0", "GPU")
  hidden = []
  monkeypatch.setattr(tf.config, "list_physical_devices",
                      lambda kind=None: [fake_gpu] if kind == "GPU" else
                      [tf.config.PhysicalDevice("/physical_device:CPU:0", "CPU")])
  monkeypatch.setattr(tf.config, "get_visible_devices",
                      lambda kind=None: [] if hidden else [fake_gpu])
  monkeypatch.setattr(tf.config, "set_visible_devices",
                      lambda devices, kind=None: hidden.append((list(devices), kind)))
  tfdist.configure_devices(DevicesConfig(logical_cpus=2))
  assert hidden == [([], "GPU")]
  tfdist.configure_devices(DevicesConfig(logical_cpus=2))  # Idempotent.
  assert hidden == [([], "GPU")]


def compiled_model():
  keras.utils.set_random_seed(1)
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="a"),
                            keras.layers.Dense(2, name="b")])
  model.compile("sgd", "mse")  # Keras's default jit_compile="auto".
  return model


def test_a_split_turns_off_the_xla_that_keras_auto_turned_on(monkeypatch, capsys):
  from tfdist.parallel import split
  model = compiled_model()
  # As on a GPU: Keras's "auto" resolves to True.
  monkeypatch.setattr(model, "_resolve_auto_jit_compile", lambda: True)
  model.jit_compile = True
  split(model, [["a"], ["b"]], devices=["/device:CPU:0", "/device:CPU:1"])
  assert model.jit_compile is False
  assert "tfdist: jit_compile off for the model split over devices" in capsys.readouterr().out
  model.fit(np.ones((8, 4)), np.ones((8, 2)), batch_size=4, verbose=0)


def test_a_split_refuses_xla_asked_for_where_auto_would_not_turn_it_on():
  from tfdist.parallel import split
  model = compiled_model()
  model.jit_compile = True  # Explicit: on this CPU Keras's "auto" resolves to False.
  with pytest.raises(ModelError, match="jit_compile: cannot be true on a model split"):
    split(model, [["a"], ["b"]], devices=["/device:CPU:0", "/device:CPU:1"])


def test_mirrored_over_logical_gpus_avoids_nccl():
  from tfdist.strategy import factory
  config = tfdist.load_config({"strategy": "mirrored", "devices": {"logical_gpus": 2}})
  options = dataclasses.replace(config.strategy.options,
                                devices=("/device:CPU:0", "/device:CPU:1"))
  strategy = factory._build_mirrored(options, config)
  assert isinstance(strategy.extended._cross_device_ops, tf.distribute.HierarchicalCopyAllReduce)


@pytest.mark.parametrize("devices,strategy,message", [
    ({"logical_gpus": 2, "logical_cpus": 2}, "mirrored",
     "devices.logical_gpus: cannot be combined with devices.logical_cpus"),
    ({"logical_gpus": 2}, {"name": "mirrored", "cross_device_ops": "nccl"},
     "strategy.cross_device_ops: must not be nccl with devices.logical_gpus"),
    ({"gpu_memory": "lots"}, "mirrored",
     "devices.gpu_memory: must be an integer or one of auto, growth. Received: 'lots'"),
])
def test_devices_refusals_name_the_key(devices, strategy, message):
  with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
    tfdist.load_config({"devices": devices, "strategy": strategy})
