"""Launch backends: where a launch's cluster comes from and how its processes start.

A backend is one module (or any object) with:

  NAME                                   its name, as `tfdist launch` says it
  discover(config, options, environ)     -> Discovery: the config with the cluster's addresses
                                            and this host's task (None: every task here)
  start(process)                         a `plan.ProcessPlan` started -> `subprocess.Popen`
  finish(outcome, environ)               after the launch ends (Slurm: the job's exit code)

`local` runs every task of a cluster given by counts on this machine, or the `--task` of a
real cluster; `slurm` takes the cluster and the task from an srun step's environment; `ray`
runs every task in a Ray actor of its own, and its `Discovery.runner` starts them.

A started process is a `subprocess.Popen`, or an object with Popen's `pid`, `stdout`, `poll`,
`wait` and `send_signal` and a `signal_group(signum)` (a process on another machine).

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
  """What a backend found.

  Attributes:
    config: the config, with the cluster's addresses when the backend knows them.
    task: this host's task; None runs every task here.
    local_task: this task's (index, count) among the GPU tasks of its host, or None.
    runner: where the tasks run when not as this host's children (Ray's actors): an object
      with `start(process)` (instead of the backend's), `replan(config)` (the config for a
      restart of the cluster: tasks may have moved) and `close()` (called when the launch
      ends, however it ends).
    gpus: the GPUs the plan shares among the tasks; None: this host's visible GPUs; () where
      the runner gives each task its own (Ray).
    starter: how this host starts the tasks when the backend keeps something for the
      launch's life (the local backend's preloaded fork server): an object with
      `start(process)` (instead of the backend's) and `close()` (called when the launch
      ends); None: the backend's `start`.
  """
  config: Config
  task: TaskConfig | None = None
  local_task: tuple[int, int] | None = None
  runner: object | None = None
  gpus: tuple[str, ...] | None = None
  starter: object | None = None


NAMES = ("local", "slurm", "ray")
"""The built-in backends, as `tfdist launch --backend` names them."""


def get(name: str):
  """The built-in backend called `name` (one of `NAMES`)."""
  import importlib
  if name not in NAMES:
    raise KeyError(name)
  return importlib.import_module(f"tfdist.launch.backends.{name}")

