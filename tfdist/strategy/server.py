"""The server a worker or ps task of a parameter-server cluster runs instead of a script."""

from __future__ import annotations

import os
import time

from tfdist.config.tf_config import cluster_spec
from tfdist.errors import ConfigError
from tfdist.launch.ports import accepts
from tfdist.strategy.devices import configure_devices
from tfdist.strategy.factory import ConfigLike, as_config

CHIEF_GONE_SECONDS = 30.0
"""A server ends (exit 0) once the chief it served has been unreachable this long: the job is
done (or its chief failed, which its own launcher reports), so every engine sees the job end."""


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
                      "--task)", key="task", source=config.source,
                      **({} if task is None else {"received": str(task)}))
  configure_devices(config.devices)  # A worker computes: its GPU memory as the config says.
  # Ops on a worker fail fast to the coordinator, which reschedules them (TensorFlow's PS docs).
  os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
  return tf.distribute.Server(
      tf.train.ClusterSpec(cluster_spec(config.cluster, include_evaluator=False)),
      job_name=task.type, task_index=task.index, protocol="grpc", start=True)


def serve(config: ConfigLike = None, chief_gone_seconds: float = CHIEF_GONE_SECONDS) -> None:
  """Runs the config's worker or ps server until its chief has come and gone (unreachable for
  `chief_gone_seconds` after it was reachable); without a chief, until the process is stopped.

  ```python
  tfdist.serve("ps_cluster.yaml")   # in a ps or worker task; returns when the job is done
  ```
  """
  config = as_config(config)
  server = start_server(config)
  chiefs = (config.cluster.addresses or {}).get("chief", ())
  if not chiefs:
    server.join()
  chief, seen, gone_since = chiefs[0], False, None
  while True:
    time.sleep(1.0)
    if accepts(chief):
      seen, gone_since = True, None
    elif seen:
      gone_since = gone_since or time.monotonic()
      if time.monotonic() - gone_since >= chief_gone_seconds:
        print(f"tfdist serve: the chief at {chief} is gone for {chief_gone_seconds:g} s: the "
              "job is done; stopping", flush=True)
        return
