"""Replica counts and batch sizes predicted from a config."""

import pytest

from tfdist import ConfigError, batch_sizes, load_config, replica_count
from tfdist.config import TrainingConfig


@pytest.mark.parametrize("document,gpus,replicas", [
    ({"strategy": "default"}, 4, 1),
    ({"strategy": "one_device"}, 4, 1),
    ({"strategy": "mirrored"}, 0, 1),
    ({"strategy": "mirrored", "devices": {"logical_cpus": 2}}, 0, 2),
    ({"strategy": "mirrored"}, 4, 4),
    ({"strategy": {"name": "mirrored", "devices": ["/gpu:0", "/gpu:1"]}}, 8, 2),
    ({"strategy": {"name": "central_storage", "compute_devices": ["/cpu:0"]}}, 0, 1),
    ({"cluster": {"worker": 3}}, 0, 3),
    ({"cluster": {"chief": 1, "worker": 3}}, 2, 8),
    ({"cluster": {"chief": 1, "worker": 2, "ps": 1}}, 0, 1),
])
def test_replica_count(document, gpus, replicas):
  assert replica_count(load_config(document, environ={}), gpus) == replicas


def test_global_batch_splits_over_replicas():
  sizes = batch_sizes(TrainingConfig(global_batch_size=64), 4)
  assert (sizes.global_batch_size, sizes.per_replica_batch_size) == (64, 16)


def test_per_replica_batch_multiplies():
  sizes = batch_sizes(TrainingConfig(per_replica_batch_size=32), 3)
  assert (sizes.global_batch_size, sizes.per_replica_batch_size) == (96, 32)


def test_uneven_global_batch_is_refused():
  with pytest.raises(ConfigError, match=r"training.global_batch_size: must be a multiple of the "
                     r"3 replicas. Received: 64"):
    batch_sizes(TrainingConfig(global_batch_size=64), 3)


@pytest.mark.usefixtures("two_cpus")
def test_a_script_reads_the_global_batch_size_of_its_config():
  import tfdist
  mirrored = {"strategy": "mirrored", "devices": {"logical_cpus": 2}}
  assert tfdist.global_batch_size({**mirrored, "training": {"per_replica_batch_size": 16}}) == 32
  assert tfdist.global_batch_size({"training": {"global_batch_size": 48}}) == 48
  with pytest.raises(ConfigError, match="training.global_batch_size: is not set"):
    tfdist.global_batch_size({"strategy": "default"})
