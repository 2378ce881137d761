"""The server a worker or ps task of a parameter-server cluster runs instead of a script."""

from __future__ import annotations

import os

from tfdist.strategy.factory import ConfigLike, as_config
from tfdist.config.tf_config import cluster_spec
from tfdist.errors import ConfigError


def start_server(config: ConfigLike = None):
  """Starts the `tf.distribute.Server` of the config's task and returns it.

  Args:
    config: a `Config`, or anything `tfdist.load_config` takes (None reads the environment).

  Raises:
    ConfigError: the config has no addressed cluster or no task.
  """
  import tensorflow as tf

  config = as_config(config)
  task = config.task
  if task is None or not config.cluster.has_addresses:
    raise ConfigError("a server needs a cluster with addresses and a task (TF_CONFIG or "
                      "--task)", key="task", received=None if task is None else str(task),
                      source=config.source)
  # Ops on a worker fail fast to the coordinator, which reschedules them (TensorFlow's PS docs).
  os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
  return tf.distribute.Server(
      tf.train.ClusterSpec(cluster_spec(config.cluster, include_evaluator=False)),
      job_name=task.type, task_index=task.index, protocol="grpc", start=True)


def serve(config: ConfigLike = None) -> None:
  """Runs the config's worker or ps server until the process is stopped."""
  start_server(config).join()
