"""Multi-worker strategies for real: one process per task on 127.0.0.1, each with the TF_CONFIG
and TFDIST_CONFIG a launcher sets; every process bounded in time and killed by id."""

import sys

from tfdist import load_config
from tfdist.config import TaskConfig
from tfdist.testing.local_cluster import (local_cluster, run_everywhere, running, start_task,
                                          wait)
from tests.conftest import CONFIGS, PROGRAMS, REPO

TIMEOUT = 120


def test_multi_worker_mirrored_all_reduce_over_two_processes(tmp_path):
  processes = run_everywhere(CONFIGS / "multi_worker_mirrored.yaml",
                             [sys.executable, str(PROGRAMS / "allreduce.py")], tmp_path, TIMEOUT,
                             env={"PYTHONPATH": str(REPO)})
  for p in processes:
    assert p.process.returncode == 0, p.output()[-3000:]
    assert "replicas=2 sum=3.0" in p.output()


def test_parameter_server_chief_schedules_on_worker_servers(tmp_path):
  config_path = CONFIGS / "parameter_server.yaml"
  cluster = local_cluster(load_config(config_path, environ={}).cluster)
  env = {"PYTHONPATH": str(REPO)}
  servers = [start_task(task, [sys.executable, "-m", "tfdist", "serve"], cluster, tmp_path,
                        config_path=config_path, env=env)
             for task in cluster.tasks() if task.type in ("worker", "ps")]
  chief = start_task(TaskConfig("chief", 0), [sys.executable, str(PROGRAMS / "ps_chief.py")],
                     cluster, tmp_path, config_path=config_path, env=env)
  with running(servers + [chief]):
    wait([chief], TIMEOUT)
    assert chief.process.returncode == 0, chief.output()[-3000:]
    assert "variable_device=/job:ps/replica:0/task:0/device:CPU:0" in chief.output()
    assert "results=[42.0, 42.0, 42.0, 42.0]" in chief.output()
    assert all(s.process.poll() is None for s in servers), "a server died"
  for s in servers:
    assert "tfdist serve: " in s.output()
