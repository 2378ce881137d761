"""TF_CONFIG for every task, produced by pure functions."""

import json

import pytest

from tfdist import ConfigError
from tfdist.config import ClusterConfig, TaskConfig, cluster_spec, tf_config_for, tf_config_json
from tfdist.config.tf_config import split_address, with_local_addresses


def test_local_addresses_follow_launch_order():
  cluster = with_local_addresses(ClusterConfig(chief=1, worker=2, ps=1), [5000, 5001, 5002, 5003])
  assert cluster.addresses == {"chief": ("127.0.0.1:5000",),
                               "worker": ("127.0.0.1:5001", "127.0.0.1:5002"),
                               "ps": ("127.0.0.1:5003",)}


def test_local_addresses_need_one_port_per_task():
  with pytest.raises(ValueError, match="3 ports are needed, 2 were given"):
    with_local_addresses(ClusterConfig(worker=3), [1, 2])


def test_each_task_gets_the_whole_cluster_and_its_own_task():
  cluster = with_local_addresses(ClusterConfig(worker=2, evaluator=1), [6000, 6001, 6002])
  assert tf_config_for(cluster, TaskConfig("worker", 1)) == {
      "cluster": {"worker": ["127.0.0.1:6000", "127.0.0.1:6001"],
                  "evaluator": ["127.0.0.1:6002"]},
      "task": {"type": "worker", "index": 1}}
  assert json.loads(tf_config_json(cluster, TaskConfig("evaluator", 0)))["task"] == {
      "type": "evaluator", "index": 0}


def test_training_tasks_do_not_see_the_evaluator():
  cluster = with_local_addresses(ClusterConfig(chief=1, worker=1, ps=1, evaluator=1),
                                 [1, 2, 3, 4])
  assert set(cluster_spec(cluster, include_evaluator=False)) == {"chief", "worker", "ps"}


def test_counts_have_no_spec_until_addresses_are_assigned():
  with pytest.raises(ValueError, match="assign addresses first"):
    cluster_spec(ClusterConfig(worker=2))


@pytest.mark.parametrize("address,expected", [
    ("127.0.0.1:2222", ("127.0.0.1", 2222)),
    ("worker-0.svc.cluster.local:2222", ("worker-0.svc.cluster.local", 2222)),
    ("[::1]:80", ("::1", 80)),
])
def test_split_address(address, expected):
  assert split_address(address) == expected


@pytest.mark.parametrize("address", ["host", "host:", ":80", "host:0", "host:x", "::1:80",
                                     "a b:1", "http://h:1"])
def test_split_address_rejects(address):
  with pytest.raises(ConfigError, match="host:port"):
    split_address(address)
