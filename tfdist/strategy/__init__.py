"""Validated config → cluster resolver → `tf.distribute` strategy.

Takes: a validated `Config` (its strategy declared in `tfdist.config.strategies`). Gives: the
strategy, one per config and process (`factory.py`: one builder per declared strategy), the
devices split before TensorFlow starts (`devices.py`), a parameter-server cluster's servers
(`cluster_server.py`), a launched task's strategy made at `import tfdist` (`startup.py`).
Never imports: `training`, `launch`, `cli`."""

from tfdist.strategy.devices import configure_devices
from tfdist.strategy.factory import (central_storage, default, make_strategy, mirrored,
                                     multi_worker_mirrored, one_device, parameter_server)
from tfdist.strategy.resolver import cluster_resolver
from tfdist.strategy.cluster_server import run_cluster_server, start_cluster_server
