"""A checkpoint folder held by one job at a time: a lease file in `checkpoint.dir`.

Two jobs of one config (a re-submitted sbatch script, two `tfdist launch` runs in one folder)
would otherwise resume from and overwrite each other's backups, and crash on h5py's file lock.
The first task of a job to train writes `checkpoint.dir/.tfdist-lease` (the job, host, pid and
a heartbeat refreshed every `REFRESH_S`); every task of the same job (the launch's run name,
`TFDIST_RUN`: the same across the launcher's restarts and a Slurm requeue) trains beside it; a
task of another job is refused before training in one line naming the key, the folder and the
holder. A lease whose holder is gone (its process dead on this host, or its heartbeat older
than `STALE_S`: a crashed host, a preempted or requeued job) is taken over.

Shared filesystems (NFS) do not promise `flock` across hosts: the lease is written whole
(`os.replace`) and read back after a pause, so of two jobs taking a stale lease at once the one
whose write was replaced sees the other's and is refused.

```python
holder = lease.hold(config)   # ConfigError when another live job holds checkpoint.dir
```
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import socket
import threading
import time

from tfdist.config.loader import RUN_ENV
from tfdist.config.schema import Config
from tfdist.machine import children
from tfdist.errors import ConfigError

FILE = ".tfdist-lease"
REFRESH_S = 5.0
STALE_S = 30.0
_SETTLE_S = 0.2  # Between writing a lease and reading it back.
_HELD: dict[str, "Lease"] = {}


def job_id(config: Config, environ=os.environ) -> str:
  """This process's job: its cluster's addresses (every task of a job has the same TF_CONFIG
  cluster, on every host and after a Slurm requeue; two local launches get different free
  ports), else the launch's run name (`TFDIST_RUN`, the same across restarts), else this
  process alone (host:pid)."""
  if config.cluster.has_addresses:
    digest = hashlib.sha1(repr(config.cluster.addresses).encode()).hexdigest()[:12]
    return f"cluster-{digest}"
  return environ.get(RUN_ENV) or f"{socket.gethostname()}:{os.getpid()}"


class Lease:
  """This job's hold on a checkpoint folder, refreshed by a daemon thread until `release`."""

  def __init__(self, directory: str, job: str, run: str):
    self.path, self.job, self.run = os.path.join(directory, FILE), job, run
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._refresh, daemon=True, name="tfdist-lease")

  def record(self) -> dict:
    return {"job": self.job, "run": self.run, "host": socket.gethostname(), "pid": os.getpid(),
            "heartbeat": time.time()}

  def write(self) -> None:
    temporary = f"{self.path}.{socket.gethostname()}.{os.getpid()}"
    with open(temporary, "w") as out:
      json.dump(self.record(), out)
    os.replace(temporary, self.path)

  def start(self) -> None:
    self._thread.start()
    atexit.register(self.release)

  def _refresh(self) -> None:
    while not self._stop.wait(REFRESH_S):
      holder = read(self.path)
      if holder is not None and holder.get("job") == self.job and \
          holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
        with contextlib.suppress(OSError):
          self.write()

  def release(self) -> None:
    """Removes the lease where this process wrote it (a peer task of the job leaves it)."""
    self._stop.set()
    holder = read(self.path)
    if holder and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
      with contextlib.suppress(OSError):
        os.remove(self.path)
    _HELD.pop(os.path.dirname(self.path), None)


def read(path: str) -> dict | None:
  try:
    with open(path) as lease:
      return json.load(lease)
  except (OSError, ValueError):
    return None


def gone(holder: dict, now: float | None = None) -> bool:
  """Whether a lease's holder is gone: its process dead on this host, or no heartbeat for
  `STALE_S` seconds. Pure but for the process check."""
  now = time.time() if now is None else now
  if holder.get("host") == socket.gethostname() and \
      not children.alive(int(holder.get("pid", -1))):
    return True
  return now - float(holder.get("heartbeat", 0)) > STALE_S


def hold(config: Config, environ=os.environ) -> Lease | None:
  """Takes (or joins) this job's lease on `checkpoint.dir` before training.

  Args:
    config: the run's config; nothing is held without a `checkpoint.dir`, or by an evaluator
      (it only reads).
    environ: gives the job (`job_id`).

  Returns:
    The `Lease` this process refreshes, or None (nothing to hold, or a peer task of this job
    holds it).

  Raises:
    ConfigError: another job's live lease holds the folder.
  """
  directory = config.checkpoint.dir
  if not directory or (config.task is not None and config.task.type == "evaluator"):
    return None
  directory = os.path.abspath(directory)
  if directory in _HELD:
    return _HELD[directory]
  os.makedirs(directory, exist_ok=True)
  job = job_id(config, environ)
  lease = Lease(directory, job, environ.get(RUN_ENV) or job)
  holder = read(lease.path)
  if holder is not None and not gone(holder):
    if holder.get("job") == job:
      return None  # A live peer task of this job holds it.
    _refuse(config, directory, holder)
  lease.write()  # Free, or its holder gone (this job's before a restart, or another's).
  time.sleep(_SETTLE_S)
  holder = read(lease.path)
  if holder is None or holder.get("job") != job:
    _refuse(config, directory, holder or {"run": "another job"})
  if holder.get("pid") != os.getpid() or holder.get("host") != socket.gethostname():
    return None  # A peer task of this job wrote after this one: it refreshes.
  lease.start()
  _HELD[directory] = lease
  return lease


def _refuse(config: Config, directory: str, holder: dict) -> None:
  age = max(time.time() - float(holder.get("heartbeat", time.time())), 0.0)
  raise ConfigError(
      f"is held by another running job: run {holder.get('run', holder.get('job'))} (host {holder.get('host')}, pid "
      f"{holder.get('pid')}, heartbeat {age:.0f} s ago); two jobs would resume from and "
      f"overwrite each other's backups: give this job a checkpoint.dir of its own (one per job "
      f"of a sweep), or wait for that one to end",
      key="checkpoint.dir", received=directory, source=config.source)
