"""The cluster server (a `tf.distribute.Server`) a worker or ps task of a parameter-server
cluster runs instead of a script: `tfdist cluster-server`."""

from __future__ import annotations

import os
import signal
import threading

from tfdist.config.tf_config import cluster_spec
from tfdist.errors import ConfigError
from tfdist.machine.chief_watch import CHIEF_GONE_SECONDS, until_chief_gone
from tfdist.strategy.devices import configure_devices
from tfdist.config.loader import ConfigLike, as_config

def start_cluster_server(config: ConfigLike = None):
  """Starts the `tf.distribute.Server` of the config's task and returns it.

  Args:
    config: a `Config`, or anything `tfdist.load_config` takes (None reads the environment).

  Returns:
    The started `tf.distribute.Server` (`.join()` it, or let it serve while the process lives).

  Raises:
    ConfigError: the config has no addressed cluster or no task.

  Example:

  ```python
  import portpicker
  import tfdist
  cluster = {role: [f"127.0.0.1:{portpicker.pick_unused_port()}"]
             for role in ("chief", "worker", "ps")}
  server = tfdist.start_cluster_server({"strategy": "parameter_server", "cluster": cluster,
                                        "task": {"type": "ps", "index": 0}})
  print(server.target)   # grpc://127.0.0.1:...
  ```
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


def run_cluster_server(config: ConfigLike = None, chief_gone_seconds: float = CHIEF_GONE_SECONDS) -> None:
  """Runs the config's worker or ps server until its chief has come and gone (unreachable for
  `chief_gone_seconds` after it was reachable); without a chief, until the process is stopped.
  `tfdist launch` runs it (as `tfdist cluster-server`) in a parameter-server cluster's worker
  and ps tasks.

  Args:
    config: a `Config`, or anything `tfdist.load_config` takes (None reads the environment).
    chief_gone_seconds: how long the chief may be unreachable, once seen, before the job counts
      as done.

  Raises:
    ConfigError: the config has no addressed cluster or no task.

  Example:

  ```python
  import threading
  import portpicker
  import tfdist
  chief, worker, ps = (f"127.0.0.1:{portpicker.pick_unused_port()}" for _ in range(3))
  config = tfdist.load_config({"strategy": "parameter_server", "cluster": {
      "chief": [chief], "worker": [worker], "ps": [ps]}}, task="ps:0")
  # A ps task's whole program; here in a thread: the chief never comes, so it serves on.
  threading.Thread(target=tfdist.run_cluster_server, args=(config,), daemon=True).start()
  ```
  """
  config = as_config(config)
  server = start_cluster_server(config)
  chiefs = (config.cluster.addresses or {}).get("chief", ())
  if not chiefs:
    server.join()
  why = until_chief_gone(chiefs[0], chief_gone_seconds,
                         _serve_the_chiefs_save(config, chiefs[0]))
  print(f"tfdist cluster-server: {why}", flush=True)


def _serve_the_chiefs_save(config, chief: str) -> threading.Event:
  """A preemption notice reaches every task at once (the launcher forwards it, Slurm signals
  every task): the chief saves its backup from the variables this server holds, so a SIGTERM
  here ends the server only once the chief is gone (the launcher's grace period bounds it), and
  `checkpoint.preemption_signal` is the chief's alone. Returns the event SIGTERM sets."""
  stopping = threading.Event()
  if threading.current_thread() is not threading.main_thread():
    return stopping

  def on_sigterm(signum, frame):
    del signum, frame
    if not stopping.is_set():
      print(f"tfdist cluster-server: SIGTERM received: serving until the chief at {chief} has "
            "saved and gone", flush=True)
    stopping.set()
  signal.signal(signal.SIGTERM, on_sigterm)
  notice = getattr(signal, config.checkpoint.preemption_signal)
  if notice != signal.SIGTERM:
    signal.signal(notice, signal.SIG_IGN)
  return stopping
