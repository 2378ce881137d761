"""The dispatcher and data workers of the tf.data service, each at its address of the config's
cluster (TensorFlow's `DispatchServer` and `WorkerServer`)."""

from __future__ import annotations

from tfdist.config.loader import ConfigLike, as_config
from tfdist.config.schema import DATA_SERVICE_JOBS
from tfdist.config.tf_config import split_address
from tfdist.errors import ConfigError
from tfdist.machine.chief_watch import CHIEF_GONE_SECONDS, until_chief_gone

WORKER_HEARTBEAT_MS = 1000
"""How often a data worker asks the dispatcher for work (TensorFlow's default, 30 s, leaves a
restarted dispatcher's workers idle that long)."""


def data_service_address(config: ConfigLike = None) -> str:
  """The tf.data service's dispatcher, as `distribute(service=...)` takes it.

  Args:
    config: a `Config`, or anything `tfdist.load_config` takes (None: a launched task's, whose
      addresses the launcher gives).

  Returns:
    "grpc://host:port".

  Raises:
    ConfigError: the cluster has no dispatcher, or no address for it.

  Example:

  ```python
  import tfdist
  config = tfdist.load_config({"cluster": {
      "worker": ["127.0.0.1:2000"], "dispatcher": ["127.0.0.1:2001"],
      "data_worker": ["127.0.0.1:2002"]}})
  service = tfdist.data_service_address(config)      # "grpc://127.0.0.1:2001"
  # In a launched script (the dispatcher running), where the address comes from tfdist launch:
  #   dataset.apply(tf.data.experimental.service.distribute("distributed_epoch",
  #                                                         tfdist.data_service_address()))
  ```
  """
  config = as_config(config)
  addresses = (config.cluster.addresses or {}).get("dispatcher")
  if not addresses:
    raise ConfigError("needs a dispatcher with its address (cluster.dispatcher; a launched "
                      "task gets it from tfdist launch)", key="cluster.dispatcher",
                      source=config.source, received=config.cluster.dispatcher)
  return f"grpc://{addresses[0]}"


def own_address(config: ConfigLike = None) -> str:
  """The host:port of the config's task, a dispatcher or a data worker.

  Raises:
    ConfigError: no task of the tf.data service, or no addresses.
  """
  config = as_config(config)
  task = config.task
  if task is None or task.type not in DATA_SERVICE_JOBS or \
      task.type not in (config.cluster.addresses or {}):
    raise ConfigError(f"must be one of the tf.data service's roles ({', '.join(DATA_SERVICE_JOBS)}"
                      ") of a cluster with addresses", key="task", source=config.source,
                      received=str(task))
  return config.cluster.addresses[task.type][task.index]


def start_data_service_server(config: ConfigLike = None):
  """Starts the config's task, a dispatcher or a data worker, at its address.

  Args:
    config: a `Config` with an addressed cluster and a `task` of `DATA_SERVICE_JOBS`.

  Returns:
    The started `tf.data.experimental.service.DispatchServer` or `WorkerServer`.

  Raises:
    ConfigError: no task of the tf.data service, or no addresses.
  """
  import tensorflow as tf
  service = tf.data.experimental.service
  config = as_config(config)
  address = own_address(config)
  _, port = split_address(address)
  if config.task.type == "dispatcher":
    work_dir = config.data_service.work_dir
    return service.DispatchServer(service.DispatcherConfig(
        port=port, protocol="grpc", work_dir=work_dir, fault_tolerant_mode=bool(work_dir)))
  dispatcher = data_service_address(config).removeprefix("grpc://")
  return service.WorkerServer(service.WorkerConfig(
      dispatcher_address=dispatcher, worker_address=address, port=port, protocol="grpc",
      heartbeat_interval_ms=WORKER_HEARTBEAT_MS))


def run_data_service_server(config: ConfigLike = None,
                            chief_gone_seconds: float = CHIEF_GONE_SECONDS) -> None:
  """Runs the config's dispatcher or data worker until the trainers' chief has come and gone
  (unreachable for `chief_gone_seconds` after it was reachable: a launch per host ends there),
  or until the process is stopped (`tfdist launch` stops it when the training ends)."""
  config = as_config(config)
  server = start_data_service_server(config)
  addresses = config.cluster.addresses or {}
  chiefs = addresses.get("chief") or addresses.get("worker")
  if not chiefs:
    server.join()
  print(f"tfdist data-service: {until_chief_gone(chiefs[0], chief_gone_seconds)}", flush=True)
