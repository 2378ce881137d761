"""The cluster resolver of a validated config.

tfdist never lets TensorFlow read TF_CONFIG on its own: the config (which already merged
TF_CONFIG and was checked) becomes a `SimpleClusterResolver` here.
"""

from __future__ import annotations

from tfdist.config.schema import Config
from tfdist.config.tf_config import cluster_spec
from tfdist.errors import ConfigError
from tfdist.strategy.devices import local_gpu_count


def cluster_resolver(config: Config):
  """The cluster resolver a strategy takes, made from the config (TF_CONFIG is never read by
  TensorFlow itself: the config merged and checked it).

  Args:
    config: a validated `Config`.

  Returns:
    A `tf.distribute.cluster_resolver.SimpleClusterResolver` for the config's cluster and task,
    counting this machine's GPUs. An empty cluster gives an empty resolver: a strategy's
    single-machine mode. The evaluator is left out of the training tasks' cluster: a
    parameter-server coordinator dials every task and would wait forever for it.

  Raises:
    ConfigError: the cluster has no addresses yet, or the task is not set.

  Example:

  ```python
  import tfdist
  config = tfdist.load_config({
      "strategy": "multi_worker_mirrored",
      "cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]},
      "task": {"type": "worker", "index": 0}})
  resolver = tfdist.cluster_resolver(config)
  print(resolver.task_type, resolver.task_id)   # worker 0
  ```
  """
  import tensorflow as tf

  cluster, task = config.cluster, config.task
  # Multi-worker strategies count this machine's GPUs through the resolver (it defaults to 0).
  gpus = {"GPU": local_gpu_count()}
  if cluster.is_empty:
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({}), rpc_layer="grpc", num_accelerators=gpus)
  if not cluster.has_addresses:
    raise ConfigError("gives task counts, whose addresses `tfdist launch` assigns; start this "
                      "script with `tfdist launch`, or list host:port addresses", key="cluster",
                      received=cluster.counts(), source=config.source)
  if task is None:
    raise ConfigError("must be set for a cluster: give --task TYPE:INDEX, a task section, or "
                      "TF_CONFIG (tfdist launch sets it)", key="task", source=config.source)
  spec = cluster_spec(cluster, include_evaluator=task.type == "evaluator")
  return tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(spec), task_type=task.type, task_id=task.index, rpc_layer="grpc",
      num_accelerators=gpus)
