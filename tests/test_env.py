"""`tfdist env`: the facts a bug report needs, on this machine and on every task of a cluster."""

import json
import sys

import tensorflow as tf

from tfdist.monitoring.environment import differences, render
from tfdist.testing import forked
from tests.conftest import CONFIGS, REPO
from tests.launching import ENV


def tfdist(*args):
  return forked.run([sys.executable, "-m", "tfdist", "env", *args], cwd=REPO, env=ENV,
                    timeout=180)


def test_env_reports_versions_build_devices_and_what_auto_picks():
  result = tfdist("--json")
  assert result.returncode == 0, result.stderr
  facts = json.loads(result.stdout.strip().splitlines()[-1])
  assert facts["tensorflow"] == tf.__version__
  # The suite hides a GPU machine's GPUs (conftest); the wheel may be either build.
  assert facts["tensorflow_build"].split(",")[0] in ("cpu", "cuda") and facts["gpus"] == []
  assert facts["auto_precision"].split()[0] in ("float32", "mixed_bfloat16")
  if facts["auto_precision"] != "float32":  # A CPU with a half type: auto measured it.
    assert " measured " in facts["auto_precision"]
  assert result.stderr == ""  # No TensorFlow banners (absl prints them before its log level).
  assert len(facts["free_ports"]) == 2 and all(1024 < p < 65536 for p in facts["free_ports"])
  text = tfdist().stdout
  assert f"tensorflow: {tf.__version__}\n" in text and "gpus: none\n" in text


def test_env_of_a_cluster_runs_on_every_task_and_says_what_differs():
  result = tfdist(str(CONFIGS / "multi_worker_mirrored.yaml"))
  assert result.returncode == 0, result.stderr
  assert "== worker-0\n" in result.stdout and "== worker-1\n" in result.stdout
  assert '"task": {"index": 1, "type": "worker"}' in result.stdout
  assert result.stdout.rstrip().endswith("the 2 tasks agree")


def test_env_of_a_cluster_as_json_and_of_a_single_machine_config():
  result = tfdist(str(CONFIGS / "multi_worker_mirrored.yaml"), "--json")
  assert result.returncode == 0, result.stderr
  report = json.loads(result.stdout)
  assert sorted(report["tasks"]) == ["worker-0", "worker-1"] and report["differences"] == []
  assert report["tasks"]["worker-0"]["tensorflow"] == tf.__version__
  single = tfdist(str(CONFIGS / "mirrored.yaml"))
  assert single.returncode == 0, single.stderr
  assert single.stdout.startswith("== local\n") and f"tensorflow: {tf.__version__}\n" in single.stdout


def test_differences_name_the_fact_and_each_tasks_value():
  reports = {"worker-0": {"tensorflow": "2.21.0", "free_ports": [1], "keras": "3.15.1"},
             "worker-1": {"tensorflow": "2.20.0", "free_ports": [2], "keras": "3.15.1"}}
  assert differences(reports) == ["tensorflow differs: worker-0: 2.21.0; worker-1: 2.20.0"]
  assert render({"gpus": [{"name": "A100", "compute_capability": "8.0"}], "tf_config": ""}) == (
      "gpus: A100 (compute capability 8.0)\ntf_config: (unset)")
