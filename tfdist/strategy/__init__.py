"""Validated config → cluster resolver → `tf.distribute` strategy."""

from tfdist.strategy.devices import configure_devices
from tfdist.strategy.factory import (central_storage, default, make_strategy, mirrored,
                                     multi_worker_mirrored, one_device, parameter_server)
from tfdist.strategy.resolver import cluster_resolver
from tfdist.strategy.cluster_server import run_cluster_server, start_cluster_server
