"""Pure conversions between a config's cluster and TensorFlow's TF_CONFIG.

Nothing here imports TensorFlow or touches the environment: the launcher and `tfdist check`
use these functions to say what every task will get before anything starts.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
from typing import Mapping, Sequence

from tfdist.config.schema import DATA_SERVICE_JOBS, JOBS, ClusterConfig, TaskConfig
from tfdist.errors import ConfigError

LOCALHOST = "127.0.0.1"
"""The only address a cluster on this machine uses."""

_ADDRESS_RULE = 'must be "host:port" with a port from 1 to 65535'


def split_address(address: str) -> tuple[str, int]:
  """Splits `host:port` (or `[v6]:port`) into host and port.

  Raises:
    ConfigError: the address is malformed; the caller adds the key.
  """
  if not isinstance(address, str):
    raise ConfigError(_ADDRESS_RULE, received=address)
  host, sep, port = address.rpartition(":")
  bracketed = host.startswith("[") and host.endswith("]")
  if bracketed:
    host = host[1:-1]
  # An IPv6 host needs brackets: `::1:80` could be `[::1]:80` or `[::1:80]`.
  if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535 or (
      (":" in host or bracketed) and not (bracketed and _is_ipv6(host))) or any(
          c.isspace() or c in "/@[]" for c in host):
    raise ConfigError(_ADDRESS_RULE, received=address)
  return host, int(port)


def _is_ipv6(host: str) -> bool:
  try:
    return ipaddress.ip_address(host).version == 6
  except ValueError:
    return False


def with_local_addresses(cluster: ClusterConfig, ports: Sequence[int]) -> ClusterConfig:
  """Gives a cluster of counts loopback addresses, one port per task in launch order.

  Args:
    cluster: a cluster given by counts.
    ports: free ports, as many as the cluster has tasks.

  Returns:
    The same cluster with `127.0.0.1:PORT` addresses.

  ```python
  with_local_addresses(ClusterConfig(worker=2), [2222, 2223]).addresses
  # {'worker': ('127.0.0.1:2222', '127.0.0.1:2223')}
  ```
  """
  tasks = cluster.tasks()
  if len(ports) != len(tasks):
    raise ValueError(f"{len(tasks)} ports are needed, {len(ports)} were given")
  addresses = {job: [] for job in cluster.jobs}
  for task, port in zip(tasks, ports):
    addresses[task.type].append(f"{LOCALHOST}:{port}")
  return dataclasses.replace(cluster, addresses={j: tuple(a) for j, a in addresses.items()})


def cluster_spec(cluster: ClusterConfig, *, include_evaluator: bool = True) -> dict[str, list[str]]:
  """The cluster as TF_CONFIG's `cluster` mapping.

  Args:
    cluster: a cluster with addresses.
    include_evaluator: False leaves the evaluator out. Training tasks must not see it: a
      parameter-server coordinator dials every task it is given and waits forever for an
      evaluator that does not serve (measured with TensorFlow 2.21).

  The tf.data service's roles are never in it (`DATA_SERVICE_JOBS`: no strategy knows them; a
  launched task finds them in `DATA_SERVICE_ENV`).
  """
  if cluster.addresses is None:
    raise ValueError("the cluster is given by counts; assign addresses first")
  return {job: list(cluster.addresses[job]) for job in cluster.jobs
          if job in cluster.addresses and (include_evaluator or job != "evaluator") and
          job not in DATA_SERVICE_JOBS}


def tf_config_for(cluster: ClusterConfig, task: TaskConfig) -> dict:
  """The TF_CONFIG document of one task: the whole cluster, and the task.

  Args:
    cluster: the config's cluster, with addresses.
    task: the task whose document it is.

  Returns:
    The TF_CONFIG document as a dict (`json.dumps` it into TF_CONFIG).

  Example:

  ```python
  import tfdist
  config = tfdist.load_config({
      "strategy": "multi_worker_mirrored",
      "cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]},
      "task": {"type": "worker", "index": 1}})
  tfdist.tf_config_for(config.cluster, config.task)
  # {'cluster': {'worker': ['127.0.0.1:2222', '127.0.0.1:2223']},
  #  'task': {'type': 'worker', 'index': 1}}
  ```
  """
  return {"cluster": cluster_spec(cluster), "task": {"type": task.type, "index": task.index}}


def tf_config_json(cluster: ClusterConfig, task: TaskConfig) -> str:
  """`tf_config_for` as the JSON text TF_CONFIG holds."""
  return json.dumps(tf_config_for(cluster, task), sort_keys=True)


def parse_tf_config(text: str, source: str = "TF_CONFIG") -> Mapping:
  """Parses TF_CONFIG's JSON text into a mapping, with one-line errors.

  Raises:
    ConfigError: the text is empty, not JSON, or not a JSON object.
  """
  if not text.strip():
    raise ConfigError("is set but empty; unset it or give a JSON object with cluster and task",
                      source=source, received=text)
  try:
    document = json.loads(text)
  except json.JSONDecodeError as e:
    raise ConfigError(f"must be JSON ({e.msg} at line {e.lineno} column {e.colno})",
                      source=source, received=text) from None
  if not isinstance(document, dict):
    raise ConfigError("must be a JSON object with cluster and task", source=source,
                      received=document)
  return document


__all__ = ["JOBS", "LOCALHOST", "split_address", "with_local_addresses", "cluster_spec",
           "tf_config_for", "tf_config_json", "parse_tf_config"]
