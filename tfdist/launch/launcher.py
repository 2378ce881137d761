"""`launch(config_path, command, options)`: a whole launch as a library call, the CLI's
`tfdist launch` without its flags: the backend discovers the cluster and this host's task, the
plan is made (and so checked) before anything starts, the supervisor starts and watches it
with the backend's `start`, and the backend hears how it ended. `dry_run(...)`, the same
arguments: the plan alone, made and checked the same way, nothing started.

```python
from tfdist.launch import LaunchOptions, launch
outcome = launch("configs/multi_worker_mirrored.yaml", ["python", "train.py"],
                 LaunchOptions(max_restarts=1))
```
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import sys
import time
import warnings
from typing import Mapping, Sequence

from tfdist.config import load_config
from tfdist.config.loader import parse_task_flag
from tfdist.config.schema import TaskConfig
from tfdist.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
  """How to launch, as `tfdist launch`'s flags say it.

  Attributes:
    task: this host's task (one role of a real cluster), a `TaskConfig` or its TYPE:INDEX
      spelling (`"worker:1"`, as `--task` gives it; parsed here); None runs every task.
    backend: "local", "slurm", "ray", or a backend module (`tfdist.launch.backends`).
    grpc_port: the port of the tasks' TensorFlow servers (Slurm: the first on each node,
      tasks sharing a node counting up); None lets the backend choose. Only the Slurm
      backend reads it: the others refuse it.
    dry_run: the old way to ask for the plan (use `dry_run(...)`): `launch` then returns the
      plan, with a DeprecationWarning; gone in the next release.
    fresh: start training over instead of resuming from an earlier run's backup.
    max_restarts: restarts after a failure (the synchronous cluster, or a parameter-server
      worker alone) or a preemption.
    max_restarts_per_task: the restarts one task's failures may cause, within `max_restarts`
      (a flapping host does not spend the cluster's budget): a task failing past it is
      dropped (`min_workers`) or ends the launch; None: only `max_restarts` counts.
    startup_timeout: seconds for every task's server to come up.
    heartbeat_timeout: seconds a task may go without a heartbeat.
    hang_timeout: seconds no training task may progress before the task behind is named (a
      hang), anywhere but an epoch's end; None: `hangs.HANG_DEFAULT`, armed after every
      task's first call.
    epoch_end_timeout: the same at an epoch's end (its callbacks, checkpoints); None:
      `hangs.EPOCH_END_DEFAULT`.
    grace_period: seconds between a forwarded signal and SIGKILL.
    min_workers: an elastic cluster: a worker that fails with no restarts left is dropped and
      the rest go on from the backup, with the same global batch, while at least this many
      workers remain (torchrun's `--nnodes MIN:MAX`); None: the launch ends. The local backend
      (per-host launches with `rendezvous_port`), or Ray; synchronous training only.
    trust_network: a per-host launch's rendezvous may go without `TFDIST_RENDEZVOUS_SECRET`
      (the network is the job's alone); else one without it is refused.
    rendezvous_port: per-host elastic launches (`task` and `min_workers`): the port on the
      chief's host where the chief's launcher keeps the members (`launch.rendezvous`); every
      host's launcher gives the same. A worker whose launcher stops or goes silent is dropped;
      one started again joins and is taken in as an epoch begins.
    logs: the per-task logs' directory; None: tfdist-logs/<date-time>.
    verbose: show every task's output, not only the chief's.
    tensorboard: start TensorBoard on the config's log directory beside the cluster.
    preload: True starts the tasks' Python programs (`python SCRIPT`, `python -m MODULE`)
      forked from one process that imported TensorFlow and Keras once
      (`tfdist.machine.preload`): each start and end costs ~0.1 CPU-s instead of ~6
      (BUILD_NOTES.md); False: each task its own interpreter; None: True where this host has
      no GPU (not yet measured on one). The local backend; the others start tasks their own
      way.
    port: the old name of `grpc_port`, kept for this release (0.1) with a DeprecationWarning.

  Example:

  ```python
  from tfdist.launch import LaunchOptions, dry_run
  options = LaunchOptions(max_restarts=2, grace_period=10, verbose=True)
  plan = dry_run("configs/multi_worker_mirrored.yaml", ["python", "train.py"], options)
  print(plan.describe())   # each task's command, TF_CONFIG and log, nothing started
  ```
  """
  task: TaskConfig | str | None = None
  backend: object = "local"
  grpc_port: int | None = None
  dry_run: bool = False
  fresh: bool = False
  max_restarts: int = 0
  max_restarts_per_task: int | None = None
  startup_timeout: float = 120
  heartbeat_timeout: float = 60
  hang_timeout: float | None = None
  epoch_end_timeout: float | None = None
  grace_period: float = 25
  min_workers: int | None = None
  rendezvous_port: int | None = None
  trust_network: bool = False
  logs: str | None = None
  verbose: bool = False
  tensorboard: bool = False
  preload: bool | None = None
  port: dataclasses.InitVar[int | None] = None

  def __post_init__(self, port: int | None) -> None:
    if port is not None:
      if self.grpc_port is not None and self.grpc_port != port:
        raise ConfigError("give grpc_port alone (port is its old name)", key="port",
                          received=port)
      warnings.warn("LaunchOptions(port=...) is now LaunchOptions(grpc_port=...); the old name "
                    "goes in the next release", DeprecationWarning, stacklevel=3)
      object.__setattr__(self, "grpc_port", port)
    if isinstance(self.task, str):
      object.__setattr__(self, "task", parse_task_flag(self.task))


def launch(config_path: str, command: Sequence[str], options: LaunchOptions = LaunchOptions(),
           environ: Mapping[str, str] = os.environ):
  """Launches `command` as the config's tasks on this host and supervises them.

  Args:
    config_path: the config file (every task reads it: `TFDIST_CONFIG`).
    command: the training command each training task runs.
    options: the launch's options.
    environ: the environment a backend discovers the cluster from.

  Returns:
    The `supervisor.Outcome`: its exit code (`tfdist.exit_codes`) and reason.

  Raises:
    ConfigError: a bad config, task or command, found before anything starts.

  Example:

  ```python
  import sys
  from tfdist.launch import LaunchOptions, launch
  outcome = launch("configs/multi_worker_mirrored.yaml",
                   [sys.executable, "-c", "import tfdist; print(tfdist.task())"],
                   LaunchOptions(verbose=True, startup_timeout=60))
  print(outcome.code, outcome.message)   # 0 every task ended 0
  ```
  """
  if options.dry_run:
    warnings.warn("launch(..., LaunchOptions(dry_run=True)) is now dry_run(...); the old way "
                  "goes in the next release", DeprecationWarning, stacklevel=2)
  return _launch(config_path, command, options, environ, plan_only=options.dry_run)


def dry_run(config_path: str, command: Sequence[str], options: LaunchOptions = LaunchOptions(),
            environ: Mapping[str, str] = os.environ):
  """The plan `launch` would start, made and checked as `launch` makes it; nothing starts.

  Args:
    config_path: the config file.
    command: the training command each training task would run.
    options: the launch's options.
    environ: the environment a backend discovers the cluster from.

  Returns:
    The `plan.LaunchPlan`: each process's command, environment (TF_CONFIG) and log.

  Raises:
    ConfigError: a bad config, task or command.

  Example:

  ```python
  from tfdist.launch import dry_run
  plan = dry_run("configs/multi_worker_mirrored.yaml", ["python", "train.py"])
  print(plan.describe())   # each task's command, TF_CONFIG and log
  ```
  """
  return _launch(config_path, command, options, environ, plan_only=True)


def _launch(config_path, command, options, environ, plan_only: bool):
  from tfdist.launch import backends, plan, supervisor
  from tfdist.launch.detectors import Limits
  from tfdist.launch.hangs import Deadlines
  from tfdist.machine import ports
  from tfdist.machine import facts

  backend = (backends.get(options.backend) if isinstance(options.backend, str)
             else options.backend)
  log_dir = options.logs or os.path.join(
      "tfdist-logs", plan.new_run_name(environ, time.time(), secrets.token_hex(3)))
  held = []  # The ports of the running plan, held until it ends.
  stack = contextlib.ExitStack()
  try:
    loaded = load_config(config_path, environ={})
    found = backend.discover(loaded, options, environ)
    runner = found.runner
    starter = runner or found.starter
    if starter is not None:
      stack.callback(starter.close)  # Its tasks go with the launch, however it ends.
    config = full = found.config
    host_gpus = facts.visible_gpus() if found.gpus is None else found.gpus
    workers = tuple(t.name for t in full.cluster.tasks() if t.type == "worker")
    members = list(workers)  # A Ray runner's workers, in its numbering.

    def make_plan(fresh: bool = False, restart: bool = True, lost=()):
      """The plan without the `lost` workers (named as the config names them)."""
      nonlocal config
      while held:
        held.pop().close()
      if runner is None:  # Addresses from the config, or free ports: planned afresh.
        config = plan.without_workers(full, lost)
      else:  # Ray's actors keep their places: each newly lost worker dropped as now numbered.
        for name in [m for m in members if m in lost]:
          current = f"worker-{members.index(name)}"
          config = plan.without_workers(config, [current])
          runner.drop(current)
          members.remove(name)
        for name in [w for w in workers if w not in members and w not in lost]:  # Back.
          members.insert(index := sum(workers.index(m) < workers.index(name) for m in members),
                         name)
          config = runner.take_in(config, index)
      if restart and runner is not None:
        config = runner.replan(config)
      members_path = _members_config(config, config_path, log_dir, lost)
      if not config.cluster.has_addresses:
        held.append(ports.HeldPorts(len(config.cluster.tasks())))
      return plan.plan_launch(config, members_path, command, log_dir=log_dir,
                              task=plan.renumbered(found.task, workers, lost),
                              ports=held[0].ports if held else (), fresh=fresh,
                              gpus=host_gpus, local_task=found.local_task,
                              members_of=config_path if members_path != config_path else None)

    # Plans (and so checks) before anything starts. Only the first start is fresh: a restart
    # resumes from the backup this run wrote.
    _check_elastic(options, config, found.task, runner, getattr(backend, "NAME", ""))
    first = make_plan(fresh=options.fresh, restart=False)
    for address in plan.public_addresses(config):
      print(f"tfdist launch: warning: {address} is a public address; TensorFlow's gRPC servers "
            "have no authentication: run the cluster on a trusted, private network",
            file=sys.stderr)
    if plan_only:
      return first
    if options.tensorboard:
      stack.callback(_start_tensorboard(config))  # Stopped with the launch.
    events = None
    if config.tensorboard.log_dir:  # The launcher's lines beside the run's curves.
      from tfdist.monitoring.launch_events import LaunchEvents
      events = LaunchEvents(os.path.join(config.tensorboard.log_dir, plan.run_name(log_dir),
                                         "launcher"))
      stack.callback(events.close)
    plans = iter([first])
    limits = Limits(options.startup_timeout, options.heartbeat_timeout, options.grace_period,
                    Deadlines(options.hang_timeout, options.epoch_end_timeout))
    outcome = supervisor.Supervisor(
        lambda lost: next(plans, None) or make_plan(lost=lost), limits=limits,
        min_workers=options.min_workers, on_members=events.members if events else None,
        max_restarts=options.max_restarts, max_task_restarts=options.max_restarts_per_task,
        verbose=options.verbose, on_say=events,
        start_process=backend.start if starter is None else starter.start, workers=workers,
        membership=_membership(options, full, found.task, workers, environ, limits, stack,
                               runner)
    ).run()
  finally:
    stack.close()
    while held:
      held.pop().close()
  backend.finish(outcome, environ)
  with contextlib.suppress(BrokenPipeError, OSError):  # A reader that went away (`| head`).
    print(f"tfdist launch: {outcome.message}; exit code {outcome.code}; logs in {log_dir}",
          file=sys.stderr, flush=True)
  return outcome


def _members_config(members, config_path: str, log_dir: str, lost) -> str:
  """The config file the tasks read: the user's, or without `lost` workers a copy of it with
  the cluster it now has (a task refuses a TF_CONFIG whose job sizes differ from its file's),
  written into the logs' directory."""
  if not lost:
    return config_path
  import yaml
  from tfdist.config.loader import config_to_dict
  os.makedirs(log_dir, exist_ok=True)
  path = os.path.join(log_dir, "config-without-" + "-".join(lost) + ".yaml")
  with open(path, "w") as out:
    out.write(f"# {config_path} without {', '.join(lost)} (tfdist launch --min-workers)\n")
    yaml.safe_dump(config_to_dict(members), out, sort_keys=False)
  return path


def _membership(options: LaunchOptions, config, task, workers: tuple[str, ...],
                environ: Mapping[str, str], limits, stack: contextlib.ExitStack, runner):
  """Who this launcher runs with: alone (an elastic launch on a runner with a membership of
  its own, Ray's, takes dropped workers back as it can place them), or in a per-host elastic
  launch the chief's launcher's rendezvous (`membership.Hosting`, closed with `stack`) or
  another host's (`membership.Following`)."""
  from tfdist.config.roles import is_chief
  from tfdist.config.tf_config import split_address
  from tfdist.launch import membership, rendezvous
  if options.rendezvous_port is None:
    if options.min_workers is not None and hasattr(runner, "membership"):
      return runner.membership()
    return membership.Alone()
  chief = "chief" if config.cluster.chief else "worker"
  host, _ = split_address(config.cluster.addresses[chief][0])
  address = f"{host}:{options.rendezvous_port}"
  secret = environ.get(rendezvous.SECRET_ENV) or None
  if secret is None and not options.trust_network:  # Secure unless the user says otherwise.
    raise ConfigError(
        f"is unset: the rendezvous at {address} would hear any caller that reaches its port "
        "(a stray process could post as a worker to shrink or stop the job). Set the same "
        "secret on every host of the job, or pass --trust-network where the network is the "
        "job's alone (as TensorFlow's own gRPC servers assume)", key=rendezvous.SECRET_ENV,
        received="unset")
  if is_chief(dataclasses.replace(config, task=task)):
    if secret is None:
      print(f"tfdist launch: --trust-network: the rendezvous at {address} hears any caller "
            f"that reaches its port", file=sys.stderr, flush=True)
    try:
      served = rendezvous.Host(address, workers, rendezvous.SILENCE_S, name=task.name,
                               secret=secret)
    except OSError as e:
      raise ConfigError(f"cannot serve the rendezvous at {address}: {e.strerror}",
                        key="--rendezvous-port", received=options.rendezvous_port) from None
    stack.callback(served.close)
    return membership.Hosting(served, patience=limits.grace_period + limits.heartbeat_timeout)
  client = rendezvous.Client(address, task.name, secret)
  client.keep_alive()
  return membership.Following(client, silence=limits.heartbeat_timeout,
                              join_timeout=limits.startup_timeout)


def _check_elastic(options: LaunchOptions, config, task, runner, backend: str) -> None:
  """Refuses `min_workers` and `rendezvous_port` where they cannot apply, in one line naming
  the flag."""
  from tfdist.config import strategies
  wanted = options.min_workers
  if backend == "slurm" and wanted is not None:
    raise ConfigError("Slurm runs every task in one step, which ends when a node fails (srun "
                      "--no-kill keeps the allocation, not the step): the job restarts whole; "
                      "for an elastic cluster use per-host launches with --rendezvous-port",
                      key="--min-workers", received=wanted)
  if options.rendezvous_port is not None and (wanted is None or task is None or
                                               runner is not None):
    raise ConfigError("is for per-host elastic launches: give it with --task and "
                      "--min-workers, on the local backend", key="--rendezvous-port",
                      received=options.rendezvous_port)
  if wanted is None:
    return
  why = None
  if task is not None and options.rendezvous_port is None:
    why = ("needs --rendezvous-port on a per-host launch (the chief's launcher keeps the "
           "members; every host's launcher gives the same port)")
  elif runner is not None and not hasattr(runner, "drop"):
    why = ("needs every task launched by this launcher or a rendezvous: the local backend, or "
           "Ray (Slurm launches restart their whole cluster)")
  elif strategies.kind(config.strategy.name).asynchronous:
    why = "needs synchronous training: a parameter-server worker already restarts alone"
  elif not 1 <= wanted <= config.cluster.worker:
    why = f"must be from 1 to the cluster's {config.cluster.worker} worker(s)"
  if why:
    raise ConfigError(why, key="--min-workers", received=wanted)


def _start_tensorboard(config):
  """Starts TensorBoard on the config's log directory; returns its stop function."""
  from tfdist.monitoring.tensorboard_server import start_tensorboard, required_log_dir

  log_dir = required_log_dir(config, "for --tensorboard")
  url, stop = start_tensorboard(log_dir)
  print(f"tfdist launch: TensorBoard on {log_dir} at {url}", file=sys.stderr, flush=True)
  return stop
