"""Which GPUs each task of a host gets: pure, from the host's visible GPUs and the task's place
among the host's GPU tasks (torchrun's LOCAL_RANK idea).

TensorFlow gives every process every GPU it sees and takes nearly all of each one's memory: a
second process on the same GPU dies (`cudaSetDevice() on GPU:0 failed. Status: out of memory`,
or SIGABRT; measured on an H100). So each local task gets its own `CUDA_VISIBLE_DEVICES`: an
even share of the host's GPUs, or `devices.gpus_per_task` of them; where there are fewer GPUs
than tasks, tasks share one round-robin and must grow their memory as they need it (or keep to
`devices.gpu_memory` MiB) instead of taking it all.

```python
share_gpus(["0", "1", "2", "3"], local_index=1, local_count=2)
# GpuShare(devices=('2', '3'), shared=False)
```
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from tfdist.config.schema import Config, TaskConfig
from tfdist.errors import ConfigError

# TensorFlow's own switch: allocate GPU memory as needed instead of nearly all of it at start.
GROWTH_ENV = "TF_FORCE_GPU_ALLOW_GROWTH"


@dataclasses.dataclass(frozen=True)
class GpuShare:
  """The GPUs of one task.

  Attributes:
    devices: its `CUDA_VISIBLE_DEVICES` entries (empty: no GPU).
    shared: whether another task of the host uses one of them.
  """
  devices: tuple[str, ...]
  shared: bool = False

  def env(self, host_gpus: Sequence[str], gpu_memory: str | int) -> tuple[tuple[str, str], ...]:
    """The variables that give a task this share on a host with `host_gpus`: none on a host
    without GPUs; `CUDA_VISIBLE_DEVICES` (empty hides them all), and memory growth when the
    GPU is shared and `gpu_memory` (the config's `devices.gpu_memory`) is "auto": a task
    cannot know it shares its GPU, while "growth" and MiB it applies itself
    (`strategy.devices.configure_devices`)."""
    if not host_gpus:
      return ()
    env = (("CUDA_VISIBLE_DEVICES", ",".join(self.devices)),)
    grow = self.shared and gpu_memory == "auto" and self.devices
    return env + (((GROWTH_ENV, "true"),) if grow else ())


def share_gpus(gpus: Sequence[str], local_index: int, local_count: int,
               per_task: int | None = None) -> GpuShare:
  """The GPUs the `local_index`-th of `local_count` GPU tasks on a host gets. Pure.

  Args:
    gpus: the host's visible GPUs (`CUDA_VISIBLE_DEVICES` names).
    local_index: the task's place among the host's GPU tasks (0-based).
    local_count: how many tasks of the host use GPUs.
    per_task: GPUs each task gets (`devices.gpus_per_task`); None: an even share, or one GPU
      shared round-robin when there are fewer GPUs than tasks; 0: none.

  Returns:
    A `GpuShare`.

  Raises:
    ConfigError: `per_task` GPUs for each task are more than the host has.

  >>> share_gpus(["0", "1"], local_index=3, local_count=4)
  GpuShare(devices=('1',), shared=True)
  """
  if not gpus or per_task == 0:
    return GpuShare(())
  if per_task is not None:
    if per_task * local_count > len(gpus):
      raise ConfigError(f"asks for {per_task} GPU(s) for each of this host's {local_count} GPU "
                        f"task(s), but it has {len(gpus)} ({','.join(gpus)})",
                        key="devices.gpus_per_task", received=per_task)
    return GpuShare(tuple(gpus[local_index * per_task:(local_index + 1) * per_task]))
  if len(gpus) >= local_count:
    each = len(gpus) // local_count
    return GpuShare(tuple(gpus[local_index * each:(local_index + 1) * each]))
  return GpuShare((gpus[local_index % len(gpus)],), shared=True)


def host_shares(config: Config, gpus: Sequence[str], *, task: TaskConfig | None = None,
                local_task: tuple[int, int] | None = None) -> dict:
  """{task: its GpuShare} of the tasks a launch runs on this host: every task of a cluster given
  by counts, or `task` alone (at `local_task`, its (index, count) among the host's GPU tasks:
  Slurm's local id; default the host's GPUs are all its own); {None: the share} for a config
  without a cluster. Pure.

  >>> from tfdist.config import load_config
  >>> [s.devices for s in host_shares(load_config({"cluster": {"worker": 2}}), ["0", "1"]).values()]
  [('0',), ('1',)]
  """
  per_task = config.devices.gpus_per_task
  if config.cluster.is_empty:
    return {None: share_gpus(gpus, 0, 1, per_task)}
  here = [t for t in config.cluster.tasks() if task is None or t == task]
  computing = [t for t in here if uses_gpus(t.type, config.strategy.name)]
  shares = {}
  for t in here:
    index, count = local_task or (computing.index(t) if t in computing else 0, len(computing))
    shares[t] = share_gpus(gpus, index, count, per_task) if t in computing else GpuShare(())
  return shares


def uses_gpus(job: str, strategy: str) -> bool:
  """Whether a task of `job` computes: every task but a parameter server's ps (which only holds
  variables; given a GPU, it would take the memory the workers need) and the tf.data service's
  roles (the input pipeline runs on CPUs)."""
  from tfdist.config import strategies
  from tfdist.config.schema import DATA_SERVICE_JOBS
  return not (strategies.kind(strategy).asynchronous and job == "ps") and \
      job not in DATA_SERVICE_JOBS


def slurm_local_task(environ) -> tuple[int, int] | None:
  """(this task's index among the tasks of its node, their count) from Slurm's environment, when
  Slurm did not bind GPUs to tasks itself (`--gpus-per-task` sets `SLURM_GPUS_PER_TASK` and
  each task's CUDA_VISIBLE_DEVICES); None otherwise. Pure.

  >>> slurm_local_task({"SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
  ...                   "SLURM_NODEID": "1"})
  (1, 2)
  """
  if "SLURM_LOCALID" not in environ or "SLURM_GPUS_PER_TASK" in environ:
    return None
  counts = []
  for part in environ.get("SLURM_STEP_TASKS_PER_NODE",
                          environ.get("SLURM_TASKS_PER_NODE", "1")).split(","):
    count, _, repeat = part.partition("(x")
    counts += [int(count)] * int(repeat.rstrip(")") or 1)
  node = int(environ.get("SLURM_NODEID", "0"))
  return int(environ["SLURM_LOCALID"]), counts[min(node, len(counts) - 1)]
