"""Launch backends: where a launch's cluster comes from and how its processes start.

A backend is one module (or any object) with:

  NAME                                   its name, as `tfdist launch` says it
  discover(config, options, environ)     -> Discovery: the config with the cluster's addresses
                                            and this host's task (None: every task here)
  start(process)                         a `plan.ProcessPlan` started -> `subprocess.Popen`
  finish(outcome, environ)               after the launch ends (Slurm: the job's exit code)

`local` runs every task of a cluster given by counts on this machine, or the `--task` of a
real cluster; `slurm` takes the cluster and the task from an srun step's environment.

```python
from tfdist.launch import backends
backend = backends.get("slurm")
```
"""

from __future__ import annotations

import dataclasses

from tfdist.config.schema import Config, TaskConfig


@dataclasses.dataclass(frozen=True)
class Discovery:
  """What a backend found. Attributes: config (with the cluster's addresses when the backend
  knows them), task (this host's task; None runs every task here), local_task (this task's
  (index, count) among the GPU tasks of its host, or None)."""
  config: Config
  task: TaskConfig | None = None
  local_task: tuple[int, int] | None = None


def get(name: str):
  """The built-in backend called `name` ("local" or "slurm")."""
  from tfdist.launch.backends import local, slurm
  return {"local": local, "slurm": slurm}[name]
