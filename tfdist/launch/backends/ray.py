"""The Ray launch backend (`tfdist launch --backend ray`): every task of the config's cluster as
a Ray actor of the cluster `RAY_ADDRESS` names, its process started on the actor's node.

- Placement: one placement group, one bundle per task (1 CPU and `devices.gpus_per_task`
  GPUs), spread, so a cluster of several nodes gets one task per node where it can; a task's
  GPUs are those Ray assigns its actor (`CUDA_VISIBLE_DEVICES`).
- TF_CONFIG: each actor's node address and a port picked free on that node.
- Environment: the launcher's variables reach the tasks (each actor's `runtime_env`
  env_vars; `forwarded` leaves out the launcher host's own), as a local launch's tasks
  inherit them.
- Elastic (`--min-workers`): a worker dropped has its actor killed and its bundle left idle;
  the workers after it are renumbered, each keeping its actor, node and address. When Ray
  places an idle bundle again on another node than the one its worker was lost with (a node
  added after a node lost), the worker is taken back in as the next epoch begins
  (`NodeAdded`, this launch's membership), within `--max-restarts`.
- The supervisor is the local one: each task's process is a `RayProcess` (the `Popen` calls
  it makes, over Ray): output streamed back, the heartbeat file mirrored into the launcher's
  log folder, signals sent through the actor. A dead actor (killed, its node lost) is its
  task's failure (exit code -9); the next start of that task makes a new actor in the same
  bundle, and a restart of the cluster gives it a new address when it moved to another node.
- The job's actors and placement group are removed when the launch ends, however it ends
  (Ray also removes a driver's actors when the driver dies).

Ray comes through the `ray` extra: `pip install -e ".[cpu,ray]"`.

```python
from tfdist.launch import LaunchOptions, launch
launch("configs/multi_worker_mirrored.yaml", ["python", "train.py"],
       LaunchOptions(backend="ray"))       # RAY_ADDRESS=10.0.0.5:6379, or "auto"
```
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Mapping

from tfdist.config.loader import CONFIG_ENV
from tfdist.config.schema import Config
from tfdist.errors import ConfigError
from tfdist.launch import membership
from tfdist.launch.backends import Discovery
from tfdist.launch.decisions import HostBack, State
from tfdist.launch.liveness import HEARTBEAT_ENV
from tfdist.machine.ports import accepts

NAME = "ray"
ADDRESS_ENV = "RAY_ADDRESS"
KILLED = -signal.SIGKILL  # A task whose actor died (killed, or its node lost).
_CALL_TIMEOUT = 60  # Seconds for one call to an actor (a start, a node's address).
_SILENT_LIMIT = 180  # Seconds without an answer after which an actor counts as dead.


def discover(config: Config, options, environ: Mapping[str, str]) -> Discovery:
  """Connects to the Ray cluster `RAY_ADDRESS` names, places one actor per task of the
  config's cluster and gives the cluster their addresses.

  Raises:
    ConfigError: Ray is not installed, no Ray cluster answers at `RAY_ADDRESS`, the config
      gives addresses, `--task` or `--task-port` (Ray places the tasks), or the cluster lacks
      the resources.
  """
  if options.task is not None:
    raise ConfigError("a Ray launch runs every task of the cluster; leave --task out",
                      key="--task", received=str(options.task))
  if options.grpc_port is not None:
    raise ConfigError("Ray places the tasks and picks a free port on each one's node; leave "
                      "it out", key="--task-port", received=options.grpc_port)
  if config.cluster.has_addresses:
    raise ConfigError("give the cluster by counts (worker: 2): Ray places the tasks and gives "
                      "their addresses", key="cluster", source=config.source,
                      received=dict(config.cluster.addresses))
  ray = _connect(environ)
  job = RayJob(ray, config, options.startup_timeout)
  return Discovery(job.config, runner=job, gpus=())


def start(process) -> subprocess.Popen:
  raise RuntimeError("a Ray launch starts its tasks through its job (Discovery.runner)")


def finish(outcome, environ: Mapping[str, str]) -> None:
  del outcome, environ


def _connect(environ: Mapping[str, str]):
  """`ray`, connected to the cluster at `RAY_ADDRESS` (default "auto": the one this machine
  runs), or a one-line ConfigError."""
  try:
    import ray
  except ImportError:
    raise ConfigError("needs Ray: pip install \"tfdist[ray]\" (from a checkout: pip install -e "
                      "\".[cpu,ray]\")", key="--backend", received="ray") from None
  address = environ.get(ADDRESS_ENV) or "auto"
  expected = ("a running Ray cluster's address, host:port of its head (ray start --head), "
              "ray://host:port, or auto")
  if address.startswith(("http://", "https://")):
    raise ConfigError(f"must be {expected}; an http address is the dashboard's (Ray Jobs), "
                      "not the cluster's", key=ADDRESS_ENV, received=address)
  gcs = address.removeprefix("ray://")
  if address != "auto" and not accepts(gcs, timeout=3):
    raise ConfigError(f"must be {expected}; nothing answers there", key=ADDRESS_ENV,
                      received=address)
  if not ray.is_initialized():
    try:
      ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING,
               configure_logging=True)
    except (ConnectionError, RuntimeError, ValueError) as e:
      raise ConfigError(f"must be {expected} ({' '.join(str(e).split())})", key=ADDRESS_ENV,
                        received=address) from None
  return ray


class RayJob:
  """The actors of one launch's tasks, in one placement group (`Discovery.runner`).

  Args:
    ray: the connected `ray` module.
    config: the config, its cluster given by counts.
    timeout: seconds for the placement group to be placed.
  """

  def __init__(self, ray, config: Config, timeout: float):
    from ray.util import placement_group
    from tfdist.launch.backends.ray_task import TaskActor

    self._ray = ray
    self._tasks = [None] if config.cluster.is_empty else config.cluster.tasks()
    gpus = config.devices.gpus_per_task or 0
    self._bundle = {"CPU": 1, **({"GPU": gpus} if gpus else {})}
    _check_resources(ray, self._bundle, len(self._tasks))
    self._remote = ray.remote(TaskActor)
    self._group = placement_group([dict(self._bundle)] * len(self._tasks), strategy="SPREAD")
    self._actors: dict[str, object] = {}
    try:
      ray.get(self._group.ready(), timeout=timeout)
    except ray.exceptions.GetTimeoutError:
      self.close()
      raise ConfigError(f"the Ray cluster did not place {len(self._tasks)} task(s) of "
                        f"{self._bundle} in {timeout:g} s (--startup-timeout); it has "
                        f"{_resources(ray)} available", key="--backend",
                        received="ray") from None
    self._addresses = {}
    self._nodes: dict[str, str] = {}  # Each task's actor's node (Ray's node id).
    self._idle: list[tuple[int, str]] = []  # Dropped workers' bundles, and their lost nodes.
    self._bundles = {_name(task): index for index, task in enumerate(self._tasks)}
    for task in self._tasks:
      self._actors[_name(task)] = self._new_actor(self._bundles[_name(task)])
    if config.cluster.is_empty:
      self.config = config
    else:
      self.config = self._with_addresses(config, moved=self._tasks)

  def _new_actor(self, index: int):
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    return self._remote.options(
        num_cpus=self._bundle["CPU"], num_gpus=self._bundle.get("GPU", 0),
        runtime_env={"env_vars": forwarded(os.environ)},
        scheduling_strategy=PlacementGroupSchedulingStrategy(
            self._group, placement_group_bundle_index=index)).remote()

  def _with_addresses(self, config: Config, moved) -> Config:
    """`config` with each task's address: a new one (its actor's node, a free port there) for
    the tasks in `moved`, the known one for the others."""
    calls = {task.name: self._actors[task.name].node.remote() for task in moved}
    for name, call in calls.items():
      host, port = self._ray.get(call, timeout=_CALL_TIMEOUT)
      self._addresses[name] = f"{host}:{port}"
      self._nodes[name] = self._placed().get(self._bundles[name], "")
    addresses = {job: tuple(self._addresses[t.name] for t in self._tasks if t.type == job)
                 for job in config.cluster.jobs}
    return dataclasses.replace(config, cluster=dataclasses.replace(config.cluster,
                                                                   addresses=addresses))

  def replan(self, config: Config) -> Config:
    """Before a restart of the cluster: a new actor for each task whose actor died, and a
    new address for each that moved to another node (its node was lost)."""
    moved = [task for task in self._tasks if self._replace_if_dead(_name(task)) and task]
    return self._with_addresses(config, moved) if moved else config

  def _replace_if_dead(self, name: str) -> bool:
    """A new actor, in the same bundle, for task `name` if its actor died; whether it did."""
    if self._alive(name):
      return False
    self._actors[name] = self._new_actor(self._bundles[name])
    return True

  def drop(self, name: str) -> None:
    """Goes on without worker `name` (`tfdist launch --min-workers`): its actor killed, its
    bundle left idle, the workers after it renumbered (TF_CONFIG's indices are positions), each
    keeping its actor, bundle and address."""
    from tfdist.config.schema import TaskConfig
    gone = next(t for t in self._tasks if _name(t) == name)
    self._kill(self._actors.pop(name))
    self._addresses.pop(name, None)
    self._idle.append((self._bundles.pop(name), self._nodes.pop(name, "")))
    kept = []
    for task in self._tasks:
      if task == gone:
        continue
      if task.type == gone.type and task.index > gone.index:
        task = self._renamed(task, TaskConfig(task.type, task.index - 1))
      kept.append(task)
    self._tasks = kept

  def _renamed(self, task, renamed):
    for table in (self._actors, self._addresses, self._bundles, self._nodes):
      if task.name in table:
        table[renamed.name] = table.pop(task.name)
    return renamed

  def placeable(self) -> int:
    """How many dropped workers Ray can run again (a node added)."""
    return len(self._placed_again())

  def _placed_again(self) -> list[tuple[int, str]]:
    """The idle bundles (and their lost nodes) Ray placed on a live node other than the one
    their worker was lost with."""
    if not self._idle:
      return []
    placed = self._placed()
    alive = {node["NodeID"] for node in self._ray.nodes() if node["Alive"]}
    return [(bundle, lost) for bundle, lost in self._idle
            if placed.get(bundle) in alive and placed.get(bundle) != lost]

  def take_in(self, config: Config, index: int) -> Config:
    """Takes a dropped worker back in as `worker-<index>` (the workers from there on
    renumbered up), in an idle bundle Ray placed again, with a new actor; returns `config`
    with the cluster's addresses."""
    from tfdist.config.schema import JOBS, TaskConfig
    bundle, lost = self._placed_again()[0]
    self._idle.remove((bundle, lost))
    workers = [t for t in self._tasks if t.type == "worker"]
    for task in reversed(workers[index:]):
      self._tasks[self._tasks.index(task)] = self._renamed(
          task, TaskConfig("worker", task.index + 1))
    back = TaskConfig("worker", index)
    self._tasks = sorted(self._tasks + [back], key=lambda t: (JOBS.index(t.type), t.index))
    self._bundles[back.name] = bundle
    self._actors[back.name] = self._new_actor(bundle)
    config = dataclasses.replace(config, cluster=dataclasses.replace(
        config.cluster, worker=config.cluster.worker + 1))
    return self._with_addresses(config, [back])

  def _placed(self) -> dict[int, str]:
    """Each bundle of the job's placement group and the node Ray placed it on."""
    from ray.util import placement_group_table
    return {int(index): node for index, node in
            placement_group_table(self._group)["bundles_to_node_id"].items()}

  def membership(self) -> "NodeAdded":
    """This launch's membership: a dropped worker taken back in when a node can run it."""
    return NodeAdded(self)

  def _alive(self, name: str) -> bool:
    try:
      self._ray.get(self._actors[name].node.remote(), timeout=_CALL_TIMEOUT)
      return True
    except (self._ray.exceptions.RayActorError, self._ray.exceptions.GetTimeoutError):
      return False

  def start(self, process) -> "RayProcess":
    """Starts `process` (a `plan.ProcessPlan`) in its task's actor (a new actor in the same
    bundle where the old one died)."""
    self._replace_if_dead(process.name)
    return RayProcess(self._ray, self._actors[process.name], process)

  def _kill(self, actor) -> None:
    """The actor's task process killed, then the actor."""
    try:
      self._ray.get(actor.kill.remote(), timeout=10)
    except Exception:  # pylint: disable=broad-except  # Dead already, or unreachable.
      pass
    self._ray.kill(actor)

  def close(self) -> None:
    """Kills every actor (their processes die with them) and removes the placement group."""
    from ray.util import remove_placement_group
    for actor in self._actors.values():
      self._kill(actor)
    self._actors.clear()
    remove_placement_group(self._group)


class NodeAdded(membership.Alone):
  """A Ray launch's membership: alone, but a dropped worker is back (`HostBack`) once Ray can
  place it again (`RayJob.placeable`: a node added) and the training began an epoch since.

  Args:
    job: the launch's `RayJob`.
    every: seconds between two asks of Ray.
  """

  def __init__(self, job: RayJob, every: float = 2.0):
    self.job, self.every = job, every
    self._lost: tuple[str, ...] = ()
    self._seen_at: float | None = None  # The epoch when Ray could place them again.
    self._asked = 0.0

  def poll(self, state, epoch):
    if state is State.WAITING:
      return membership.OPENED
    now = time.monotonic()
    if state is not State.RUNNING or not self._lost or now - self._asked < self.every:
      return None
    self._asked = now
    reached = epoch()
    count = reached is not None and min(self.job.placeable(), len(self._lost))
    if not count:
      self._seen_at = None
      return None
    back = self._lost[:count]
    if self._seen_at is None:
      self._seen_at = reached
      self.say(f"Ray can place {', '.join(back)} again (a node was added): it is taken in when "
               "an epoch begins")
      return None
    if reached > self._seen_at:
      self._seen_at = float("inf")  # Offered once a round.
      return HostBack(back)
    return None

  def decided(self, event, action, lost: tuple[str, ...]) -> None:
    self._lost, self._seen_at = lost, None


class RayProcess:
  """A task's process in its Ray actor, as the supervisor uses a `subprocess.Popen`: `pid` (on
  the actor's node), `stdout`, `poll`, `wait`, `send_signal`, and `signal_group`.

  A thread follows the actor: output into `stdout`, the heartbeat file into the plan's (its
  age kept), the exit code once the process ended; a dead actor ends it with -9 and a line
  saying why."""

  def __init__(self, ray, actor, process):
    self._ray, self._actor = ray, actor
    self.returncode: int | None = None
    self._ended = threading.Event()
    self._heartbeat = dict(process.env).get(HEARTBEAT_ENV)
    files = {}
    config = dict(process.env).get(CONFIG_ENV)
    if config:
      with open(config) as f:
        files[config] = f.read()
    self.pid = ray.get(actor.start.remote(
        process.argv, dict(process.env), files, os.getcwd(), sys.executable, HEARTBEAT_ENV),
        timeout=_CALL_TIMEOUT)
    read, write = os.pipe()
    self.stdout = os.fdopen(read, "rb")
    self._out = os.fdopen(write, "wb", buffering=0)
    threading.Thread(target=self._follow, name=f"tfdist-ray-{process.name}",
                     daemon=True).start()

  def _follow(self) -> None:
    exceptions = self._ray.exceptions
    silent_since = None
    try:
      while True:
        try:
          output, beat, age, code = self._ray.get(self._actor.follow.remote(),
                                                  timeout=_CALL_TIMEOUT)
          silent_since = None
        except exceptions.GetTimeoutError:  # A slow node; Ray says when the actor is gone.
          silent_since = silent_since or time.monotonic() - _CALL_TIMEOUT
          if time.monotonic() - silent_since < _SILENT_LIMIT:
            continue
          self._write(f"tfdist launch: its Ray actor has not answered for "
                      f"{_SILENT_LIMIT:g} s (its node or the Ray cluster unreachable)\n"
                      .encode())
          self.returncode = KILLED
          return
        if output:
          self._write(output)
        if beat is not None and self._heartbeat:
          _mirror(self._heartbeat, beat, age)
        if code is not None:
          self.returncode = code
          return
    except exceptions.RayActorError as e:  # Died, or its node unreachable.
      reason = " ".join(str(e).split())[:300]
      self._write(f"tfdist launch: its Ray actor died (killed, or its node was lost): "
                  f"{reason}\n".encode())
      self.returncode = KILLED
    finally:
      self._out.close()
      self._ended.set()

  def _write(self, data: bytes) -> None:
    try:
      self._out.write(data)
    except (BrokenPipeError, OSError, ValueError):
      pass

  def poll(self) -> int | None:
    return self.returncode

  def wait(self, timeout: float | None = None) -> int:
    if not self._ended.wait(timeout):
      raise subprocess.TimeoutExpired("ray actor", timeout)
    return self.returncode

  def send_signal(self, signum: int) -> None:
    if self.returncode is None:
      self._actor.signal.remote(int(signum), False)

  def signal_group(self, signum: int) -> None:
    self._actor.signal.remote(int(signum), True)


_HOST_OWN = {"HOSTNAME", "HOME", "PWD", "OLDPWD", "SHLVL", "_", "TERM", "TERM_PROGRAM",
             "DISPLAY", "TMPDIR", "COLUMNS", "LINES"}


def forwarded(environ: Mapping[str, str]) -> dict[str, str]:
  """The launcher's environment variables its tasks get on their nodes (Ray's
  `runtime_env` env_vars, as `tfdist launch`'s local tasks inherit them): all but what
  belongs to the launcher's own host and shell (its name, home, working directory,
  terminal, SSH and session variables) and Ray's own settings. Pure."""
  return {key: value for key, value in environ.items()
          if key not in _HOST_OWN and not key.startswith(("SSH_", "XDG_", "RAY_"))}


def _mirror(path: str, text: str, age: float) -> None:
  """Writes a task's heartbeat `text` to `path` in the launcher's log folder, dated `age`
  seconds ago as on the task's node."""
  try:
    with open(f"{path}.next", "w") as out:
      out.write(text)
    beat = time.time() - age
    os.utime(f"{path}.next", (beat, beat))
    os.replace(f"{path}.next", path)
  except OSError:
    pass


def _name(task) -> str:
  return "local" if task is None else task.name


def _resources(ray) -> dict:
  return {key: value for key, value in ray.available_resources().items()
          if key in ("CPU", "GPU")}


def _check_resources(ray, bundle: dict, count: int) -> None:
  """Raises ConfigError when the whole cluster has too few CPUs or GPUs for `count` bundles."""
  total = ray.cluster_resources()
  for key, each in bundle.items():
    if total.get(key, 0) < each * count:
      raise ConfigError(f"the Ray cluster has {total.get(key, 0):g} {key}(s), {count} task(s) "
                        f"need {each:g} each (ray start --num-cpus/--num-gpus, or fewer tasks)",
                        key="--backend", received="ray")
