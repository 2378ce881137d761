"""Which task this process is, from its config: the chief writes the files others must not.

```python
config = tfdist.load_config()          # TFDIST_CONFIG / TF_CONFIG of a launched task
if tfdist.is_chief(config):
  model.save("model.keras")
```
"""

from __future__ import annotations

from tfdist.config.loader import ConfigLike, as_config
from tfdist.config.schema import TaskConfig


def is_chief(config: ConfigLike = None) -> bool:
  """The chief task, or worker 0 of a cluster without one, or a process without a cluster.

  An evaluator is never the chief: it only reads what the chief writes.

  Args:
    config: a `Config` or what `tfdist.load_config` takes; None reads the launched task's.

  Returns:
    True in the process that writes the run's files (checkpoints, logs, the saved model).

  Example:

  ```python
  import tfdist
  cluster = {"strategy": "multi_worker_mirrored", "cluster": {"worker": 2}}
  tfdist.is_chief({**cluster, "task": {"type": "worker", "index": 0}})   # True
  tfdist.is_chief({**cluster, "task": {"type": "worker", "index": 1}})   # False
  ```
  """
  config = as_config(config)
  task = config.task
  if task is None or config.cluster.is_empty:
    return True
  if config.cluster.chief:
    return task.type == "chief"
  return task.type == "worker" and task.index == 0


def task(config: ConfigLike = None) -> TaskConfig | None:
  """This process's task.

  Args:
    config: a `Config` or what `tfdist.load_config` takes; None reads the launched task's.

  Returns:
    Its `TaskConfig` (`.type`, `.index`, `.name`), or None outside a cluster.

  Example:

  ```python
  import tfdist
  task = tfdist.task({"strategy": "multi_worker_mirrored", "cluster": {"worker": 2},
                      "task": {"type": "worker", "index": 1}})
  print(task.type, task.index)   # worker 1
  ```
  """
  return as_config(config).task


def task_name(config: ConfigLike = None) -> str:
  """`<type>-<index>` of this task, or `local` for a process without a task."""
  t = task(config)
  return "local" if t is None else t.name


def tasks_on_this_host(config: ConfigLike = None) -> int | None:
  """How many of the cluster's tasks (every job's, the tf.data service's roles too) share this
  task's host, from their addresses.

  Args:
    config: a `Config` or what `tfdist.load_config` takes; None reads the launched task's.

  Returns:
    The count, this task included; None outside a cluster or where its addresses are not
    known.

  Example:

  ```python
  import tfdist
  from tfdist.config.roles import tasks_on_this_host
  tasks_on_this_host({"cluster": {"worker": ["a:1", "a:2", "b:1"]},
                      "task": {"type": "worker", "index": 0}})   # 2
  ```
  """
  config = as_config(config)
  cluster, me = config.cluster, config.task
  if me is None or not cluster.has_addresses or me.type not in cluster.addresses:
    return None
  host = lambda address: address.rsplit(":", 1)[0]  # noqa: E731
  mine = host(cluster.addresses[me.type][me.index])
  return sum(host(a) == mine for addresses in cluster.addresses.values() for a in addresses)
