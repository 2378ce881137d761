"""The launch-backend seam: a backend is one module (discovery + start + finish); a fake one
runs a real plan through `tfdist.launch.launcher.launch` without the CLI, and the built-ins
are found by name."""

import subprocess
import sys
import types

import pytest

from tfdist.launch import backends
from tfdist.launch.backends import Discovery, local
from tfdist.config.schema import TaskConfig
from tfdist.errors import ConfigError
from tfdist.launch.launcher import LaunchOptions, dry_run, launch


def fake_backend(started: list, finished: list):
  """A backend discovering a 2-worker cluster of its own on 127.0.0.1 and starting each process
  with the local runner, recording what it started and how the launch ended."""
  import dataclasses
  from tfdist.testing.local_cluster import local_cluster

  def discover(config, options, environ):
    del options, environ
    cluster = local_cluster(dataclasses.replace(config.cluster, worker=2))
    return Discovery(dataclasses.replace(config, cluster=cluster))

  def start(process) -> subprocess.Popen:
    started.append(process.name)
    return local.start(process)

  return types.SimpleNamespace(NAME="fake", discover=discover, start=start,
                               finish=lambda outcome, environ: finished.append(outcome))


def test_a_fake_backend_runs_a_plan_through_the_library_call(tmp_path):
  started, finished = [], []
  config = tmp_path / "config.yaml"
  config.write_text("strategy: multi_worker_mirrored\n")
  program = "import os; print(os.environ['TF_CONFIG'])"
  outcome = launch(str(config), [sys.executable, "-c", program],
                   LaunchOptions(backend=fake_backend(started, finished),
                                 logs=str(tmp_path / "logs"), verbose=True))
  assert outcome.code == 0, outcome
  assert sorted(started) == ["worker-0", "worker-1"] and finished == [outcome]
  logs = sorted((tmp_path / "logs").glob("worker-*.log"))
  assert [log.name for log in logs] == ["worker-0.log", "worker-1.log"]
  assert all('"cluster": {"worker": ["127.0.0.1:' in log.read_text() for log in logs)


def test_the_built_in_backends_are_found_by_name_and_dry_runs_start_nothing(tmp_path):
  assert backends.get("local") is local and backends.get("slurm").NAME == "slurm"
  config = tmp_path / "config.yaml"
  config.write_text("cluster: {worker: 2}\n")
  started = []
  backend = types.SimpleNamespace(NAME="dry", discover=local.discover, finish=local.finish,
                                  start=lambda process: started.append(process))
  plan = dry_run(str(config), ["python", "t.py"], LaunchOptions(backend=backend,
                                                               logs=str(tmp_path)))
  assert [p.name for p in plan.processes] == ["worker-0", "worker-1"] and started == []
  with pytest.warns(DeprecationWarning, match=r"LaunchOptions\(dry_run=True\)\) is now dry_run"):
    old = launch(str(config), ["python", "t.py"], LaunchOptions(backend=backend, dry_run=True,
                                                               logs=str(tmp_path)))
  assert [p.name for p in old.processes] == ["worker-0", "worker-1"] and started == []
  with pytest.raises(KeyError):
    backends.get("kubernetes")


def test_launch_options_take_the_task_parsed_and_port_as_grpc_ports_old_name():
  assert LaunchOptions(task="worker:1").task == TaskConfig("worker", 1)
  assert LaunchOptions(task=TaskConfig("ps", 0)).task == TaskConfig("ps", 0)
  with pytest.raises(ConfigError, match=r"^--task: must be TYPE:INDEX .* Received: 'worker1'$"):
    LaunchOptions(task="worker1")
  with pytest.warns(DeprecationWarning, match=r"LaunchOptions\(port=...\) is now "
                    r"LaunchOptions\(grpc_port=...\)"):
    assert LaunchOptions(port=3000).grpc_port == 3000
  with pytest.raises(ConfigError, match=r"^port: give grpc_port alone"):
    LaunchOptions(port=3000, grpc_port=3001)


@pytest.mark.parametrize("backend,options,message", [
    ("local", LaunchOptions(grpc_port=3000), "--task-port: a local launch takes free ports"),
    ("ray", LaunchOptions(grpc_port=3000), "--task-port: Ray places the tasks"),
    ("ray", LaunchOptions(task="worker:1"), "--task: a Ray launch runs every task"),
    ("slurm", LaunchOptions(task="worker:1"), "--task: Slurm gives each srun task its role"),
])
def test_a_backend_refuses_the_options_it_cannot_honour(tmp_path, backend, options, message):
  import tfdist
  config = tfdist.load_config({"cluster": {"worker": 2}}, environ={})
  with pytest.raises(ConfigError, match="^" + message):
    backends.get(backend).discover(config, options, {})
