"""Loading good configs: normalisation, strategy inference, and precedence
(defaults < file < TF_CONFIG < --task)."""

import json

import pytest

from tfdist import ConfigError, load_config
from tfdist.config import (ClusterConfig, MirroredOptions, MultiWorkerMirroredOptions,
                           TaskConfig, config_to_dict)
from tests.conftest import CONFIGS, REPO

WORKERS = ["127.0.0.1:2001", "127.0.0.1:2002"]


def tf_config(cluster, task_type, index):
  return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def test_defaults_are_one_device():
  config = load_config(None, environ={})
  assert config.strategy.name == "default"
  assert config.cluster.is_empty and config.task is None


@pytest.mark.parametrize("name", ["mirrored", "Mirrored", "MirroredStrategy", "mirrored-strategy"])
def test_strategy_names_are_normalised(name):
  assert load_config({"strategy": name}, environ={}).strategy.name == "mirrored"


def test_multi_worker_mirrored_aliases():
  config = load_config({"strategy": "MultiWorkerMirroredStrategy"}, environ={})
  assert config.strategy.name == "multi_worker_mirrored"


def test_strategy_options_sit_beside_the_name():
  config = load_config({"strategy": {"name": "mirrored", "cross_device_ops": "nccl",
                                     "devices": ["/gpu:0", "/gpu:1"]}}, environ={})
  assert config.strategy.options == MirroredOptions(("/gpu:0", "/gpu:1"), "nccl")


@pytest.mark.parametrize("cluster,expected", [
    ({"worker": 2}, "multi_worker_mirrored"),
    ({"chief": 1, "worker": 1}, "multi_worker_mirrored"),
    ({"chief": 1, "worker": 2, "ps": 1}, "parameter_server"),
    ({"worker": 1}, "default"),
])
def test_strategy_is_inferred_from_the_cluster(cluster, expected):
  assert load_config({"cluster": cluster}, environ={}).strategy.name == expected


def test_plain_tf_config_json_file_is_a_config():
  config = load_config(CONFIGS / "tf_config.json", environ={})
  assert config.strategy.name == "multi_worker_mirrored"
  assert config.task == TaskConfig("chief", 0)
  assert config.cluster.addresses == {"chief": ("127.0.0.1:12221",),
                                      "worker": ("127.0.0.1:12222",)}


def test_tf_config_extras_from_kubeflow_are_accepted():
  document = {"cluster": {"worker": WORKERS}, "task": {"type": "worker", "index": 1},
              "environment": "cloud", "rpc_layer": "grpc"}
  assert load_config(document, environ={}).task == TaskConfig("worker", 1)


def test_ipv6_addresses_are_accepted():
  config = load_config({"cluster": {"worker": ["[::1]:2001", "[::1]:2002"]}}, environ={})
  assert config.cluster.worker == 2


def test_tf_config_gives_addresses_and_task_over_file_counts(write_config):
  path = write_config("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n"
                      "training: {global_batch_size: 64}\n")
  config = load_config(path, environ={"TF_CONFIG": tf_config({"worker": WORKERS}, "worker", 1)})
  assert config.cluster.addresses == {"worker": tuple(WORKERS)}
  assert config.task == TaskConfig("worker", 1)
  assert config.training.global_batch_size == 64  # the file's other sections are kept


def test_tf_config_task_beats_file_task_and_task_flag_beats_both(write_config):
  path = write_config(f"cluster: {{worker: {json.dumps(WORKERS)}}}\n"
                      "task: {type: worker, index: 0}\n")
  environ = {"TF_CONFIG": tf_config({"worker": WORKERS}, "worker", 1)}
  assert load_config(path, environ={}).task == TaskConfig("worker", 0)
  assert load_config(path, environ=environ).task == TaskConfig("worker", 1)
  assert load_config(path, environ=environ, task="worker:0").task == TaskConfig("worker", 0)


def test_tf_config_alone_makes_the_config():
  environ = {"TF_CONFIG": tf_config({"worker": WORKERS}, "worker", 0)}
  config = load_config(None, environ=environ)
  assert config.strategy.name == "multi_worker_mirrored"
  assert config.source is None


def test_tfdist_config_env_names_the_file_for_no_argument_loads():
  environ = {"TFDIST_CONFIG": str(CONFIGS / "mirrored.yaml")}
  config = load_config(None, environ=environ)
  assert config.strategy.name == "mirrored"
  assert config.devices.logical_cpus == 2


@pytest.mark.parametrize("path", sorted(CONFIGS.iterdir()), ids=lambda p: p.name)
def test_every_example_config_loads_and_round_trips(path):
  config = load_config(path, environ={})
  assert load_config(config_to_dict(config), environ={}) == config


def test_multi_worker_example_has_counts_until_launched():
  config = load_config(CONFIGS / "multi_worker_mirrored.yaml", environ={})
  assert config.cluster == ClusterConfig(worker=2)
  assert config.strategy.options == MultiWorkerMirroredOptions("ring", 120.0, 0)


def test_an_unquoted_off_is_taken_as_meant(write_config):
  config = load_config(write_config("training: {mixed_precision: off}\n"), environ={})
  assert config.training.mixed_precision == "off"


def docs_yaml_blocks():
  from tests import docs_blocks
  return [b for page in docs_blocks.pages() for b in docs_blocks.blocks(page)
          if b.language == "yaml" and b.reason is None]


@pytest.mark.parametrize("block", docs_yaml_blocks(), ids=lambda b: b.where)
def test_every_docs_config_loads_exactly_as_written(block, write_config):
  config = load_config(write_config(block.code), environ={})
  assert load_config(config_to_dict(config), environ={}) == config


def test_a_launched_script_loading_its_file_by_path_gets_the_launchers_current_members(
    tmp_path, capsys):
  """After a shrink the launcher points TFDIST_CONFIG at a copy with the members left and names
  the user's file in TFDIST_MEMBERS_OF: `load_config(that file)` reads the copy, saying so
  once; a file of its own, or no such variable, is read as it is."""
  user = tmp_path / "cfg.yaml"
  user.write_text("cluster: {worker: 3}\nstrategy: multi_worker_mirrored\n")
  members = tmp_path / "members.yaml"
  members.write_text(f"cluster: {{worker: {json.dumps(WORKERS)}}}\n"
                     "strategy: multi_worker_mirrored\n")
  environ = {"TF_CONFIG": tf_config({"worker": WORKERS}, "worker", 1),
             "TFDIST_CONFIG": str(members), "TFDIST_MEMBERS_OF": str(user)}
  for _ in range(2):
    config = load_config(str(tmp_path / "." / "cfg.yaml"), environ=environ)
    assert config.cluster.addresses == {"worker": tuple(WORKERS)}
    assert config.task == TaskConfig("worker", 1)
  assert capsys.readouterr().err == (f"tfdist: {user} read as the launcher's current members: "
                                     f"{members} (workers were lost; tfdist launch "
                                     "--min-workers)\n")
  without = {k: v for k, v in environ.items() if k != "TFDIST_MEMBERS_OF"}
  with pytest.raises(ConfigError, match=r"must have the job sizes of .*cfg.yaml \(\{'worker': 3"):
    load_config(str(user), environ=without)
