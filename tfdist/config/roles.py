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
  """
  config = as_config(config)
  task = config.task
  if task is None or config.cluster.is_empty:
    return True
  if config.cluster.chief:
    return task.type == "chief"
  return task.type == "worker" and task.index == 0


def task(config: ConfigLike = None) -> TaskConfig | None:
  """This process's task (`.type`, `.index`), or None outside a cluster."""
  return as_config(config).task


def task_name(config: ConfigLike = None) -> str:
  """`<type>-<index>` of this task, or `local` for a process without a task."""
  t = task(config)
  return "local" if t is None else t.name
