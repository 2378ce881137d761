"""What the launcher does about what happened: the events its detectors report, the actions it
takes, its states, and `decide(event, budget) -> action`, one pure function. The supervisor
detects and acts; every choice between restarting, going on without a task and ending is here.

```python
action = decide(Failed("worker-2", code=1, how="failed"),
                Budget(restarts_left=0, workers=("worker-0", "worker-1", "worker-2"),
                       min_workers=2))
action                  # GoOnWithout(tasks=("worker-2",), restarts_left=0)
```
"""

from __future__ import annotations

import dataclasses
import enum

from tfdist.config.schema import OWN_RESTARTS
from tfdist.exit_codes import OK, PREEMPTED, SIGNALLED, STARTUP_TIMEOUT, TASK_FAILED, USAGE


class State(enum.Enum):
  """A launch's states, in order; a restart goes back through WAITING to STARTING."""
  JOINING = "joining"  # A following launcher awaits the chief's round that takes it in.
  WAITING = "waiting"  # No task running: the next round awaited (at once when alone).
  STARTING = "starting"  # Processes started; every task's server awaited (start-up deadline).
  RUNNING = "running"  # Every server up: exits, heartbeats, hangs and signals followed.
  STOPPING = "stopping"  # A signal forwarded to every task; SIGKILL after the grace period.
  ENDED = "ended"


# -- events: what a detector saw -------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class StopAsked:
  """A stop signal (Ctrl-C, a kill, a closed terminal) reached the launcher; `preempted`: every
  task then saved its backup (exit 42)."""
  signal_name: str
  signum: int
  preempted: bool


@dataclasses.dataclass(frozen=True)
class StartupTimedOut:
  """Servers still not up at the start-up deadline."""
  waiting: str
  seconds: float


@dataclasses.dataclass(frozen=True)
class Preempted:
  """A task saved its backup after a preemption notice and exited 42."""
  task: str


@dataclasses.dataclass(frozen=True)
class Failed:
  """A task failed (`code`), stopped making progress (`code` None: no heartbeat) or hung (its
  hang line said): the root cause. `task_type`: its job; `alone`: it may restart by itself
  (a parameter-server worker)."""
  task: str
  code: int | None
  how: str
  task_type: str = "worker"
  alone: bool = False
  hung: bool = False


@dataclasses.dataclass(frozen=True)
class EvaluatorHung:
  """The evaluator made no progress: it waits on no one and restarts alone."""
  task: str
  how: str = "hung"


@dataclasses.dataclass(frozen=True)
class AllDone:
  """Every task running the user's command ended with 0."""


@dataclasses.dataclass(frozen=True)
class Left:
  """Workers whose launcher left the rendezvous (stopped) or went silent (its host lost),
  as the chief's launcher sees it (`rendezvous`): named as the config names them."""
  tasks: tuple[str, ...]
  why: str


@dataclasses.dataclass(frozen=True)
class HostBack:
  """Lost workers whose launcher is back (it joined the rendezvous), at an epoch's boundary
  since it joined."""
  tasks: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class NewRound:
  """The chief's launcher published a round (`rendezvous.Round`): who runs, or the end."""
  number: int
  lost: tuple[str, ...]
  ended: tuple[int, str] | None = None


Event = (StopAsked | StartupTimedOut | Preempted | Failed | EvaluatorHung | AllDone | Left |
         HostBack | NewRound)


# -- actions: what the supervisor does --------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class RestartCluster:
  """Stop every task and start the cluster again; training resumes from its backup."""
  restarts_left: int
  why: str


@dataclasses.dataclass(frozen=True)
class RestartTask:
  """Stop `task` and start it again alone, its peers going on; `own`: the restart is the
  `own`-th of the task's own budget (`OWN_RESTARTS`), not one of `--max-restarts`."""
  task: str
  restarts_left: int
  own: int = 0


@dataclasses.dataclass(frozen=True)
class GoOnWithout:
  """Drop `tasks` from the cluster, plan it again without them and resume from the backup
  (the same global batch over fewer replicas)."""
  tasks: tuple[str, ...]
  restarts_left: int


@dataclasses.dataclass(frozen=True)
class Grow:
  """Take `tasks` back in: every task stops (saving its backup) and the cluster starts again
  with them, at the same global batch."""
  tasks: tuple[str, ...]
  restarts_left: int


@dataclasses.dataclass(frozen=True)
class Continue:
  """Nothing changes now; `why` is said once."""
  why: str
  restarts_left: int


@dataclasses.dataclass(frozen=True)
class Report:
  """A launcher that follows the chief's rounds tells it what its task did and awaits its
  decision (the next round)."""
  event: Failed | Preempted
  restarts_left: int


@dataclasses.dataclass(frozen=True)
class FollowRound:
  """Start this launcher's task in the chief's new round (without its `lost` workers)."""
  number: int
  lost: tuple[str, ...]
  restarts_left: int


@dataclasses.dataclass(frozen=True)
class End:
  """The launch ends: the exit code and the one-line reason."""
  code: int
  message: str


Action = RestartCluster | RestartTask | GoOnWithout | Grow | Continue | Report | FollowRound | End


@dataclasses.dataclass(frozen=True)
class Budget:
  """What a decision weighs besides the event.

  Attributes:
    restarts_left: restarts still allowed (`--max-restarts`, less those taken).
    workers: the training workers the cluster has now (droppable members).
    min_workers: the fewest workers it may go on with (`--min-workers`); None: the cluster is
      not elastic.
    lost: the workers already dropped.
    follows: the task this launcher runs, when it follows the chief's launcher's rounds (a
      per-host elastic launch, `rendezvous`): its task's failures are the chief's to decide.
    anchor: the task whose launcher keeps the rendezvous: never dropped (its launcher is the
      members' meeting place).
    between_rounds: no task runs (the next round is being opened): a launcher lost now joins
      the restart under way instead of taking one of its own.
    task_restarts: (task, restarts its failures caused so far), for the tasks that caused any.
    max_task_restarts: the restarts one task's failures may cause (`--max-restarts-per-task`);
      None: only `restarts_left` counts.
  """
  restarts_left: int
  workers: tuple[str, ...] = ()
  min_workers: int | None = None
  lost: tuple[str, ...] = ()
  follows: str | None = None
  anchor: str | None = None
  between_rounds: bool = False
  task_restarts: tuple[tuple[str, int], ...] = ()
  max_task_restarts: int | None = None

  def task_spent(self, task: str) -> bool:
    """Whether `task`'s failures caused all the restarts one task may cause."""
    return self.max_task_restarts is not None and \
        dict(self.task_restarts).get(task, 0) >= self.max_task_restarts


def decide(event: Event, budget: Budget) -> Action:
  """The action for `event`. Pure.

  Rules: a stop signal ends the launch (42 when every task saved its backup, else 128 + the
  signal); the start-up deadline ends it (3); every task done ends it (0). A preemption, a
  failure or a hang restarts the cluster (a parameter-server worker or the evaluator alone)
  while restarts are left, each restart taking one. With none left, a failed worker of an
  elastic cluster (`min_workers`) is dropped while at least `min_workers` remain; otherwise the
  launch ends (1; 42 after a preemption). A worker whose launcher left or went silent is
  dropped at once while `min_workers` remain (its host cannot run it), taking a restart if one
  is left; one whose launcher is back is taken in if a restart is left (membership changes
  count against `--max-restarts`, as in torchrun; one lost while the next round is being
  opened joins that restart). A task whose failures caused `--max-restarts-per-task` restarts
  is treated as with no restarts left. A task of a role holding no training state (a data
  worker, the dispatcher) is restarted alone from its own budget (`OWN_RESTARTS`) first. A
  task that exits with the usage code (tfdist refused
  its config or input) ends the launch with it (2): a restart would be refused alike. A
  launcher that follows the chief's rounds
  reports its task's failure or preemption and follows the next round; dropped from it, it
  ends (1).

  Args:
    event: what a detector saw.
    budget: the restarts left and the membership.

  Returns:
    The action to take.
  """
  left = budget.restarts_left
  if isinstance(event, NewRound):
    if event.ended is not None:
      return End(*event.ended)
    if budget.follows in event.lost:
      return End(TASK_FAILED, f"the cluster went on without {budget.follows} (round "
                              f"{event.number})")
    return FollowRound(event.number, event.lost, left)
  if budget.follows is not None and isinstance(event, (Failed, Preempted)):
    return Report(event, left)
  if isinstance(event, Left):
    remaining = len([w for w in budget.workers if w not in event.tasks])
    if budget.min_workers is not None and remaining >= budget.min_workers:
      return GoOnWithout(event.tasks, left if budget.between_rounds else max(left - 1, 0))
    return End(TASK_FAILED, f"{', '.join(event.tasks)} left ({event.why})")
  if isinstance(event, HostBack):
    if left <= 0:
      return Continue(f"{', '.join(event.tasks)} is back; no restarts left (--max-restarts) "
                      "to take it in", left)
    return Grow(event.tasks, left - 1)
  if isinstance(event, StopAsked):
    if event.preempted:
      return End(PREEMPTED, f"preempted by {event.signal_name}; backups saved")
    return End(SIGNALLED + event.signum, f"stopped by {event.signal_name}")
  if isinstance(event, StartupTimedOut):
    return End(STARTUP_TIMEOUT, f"{event.waiting} did not come up in {event.seconds:g} s")
  if isinstance(event, AllDone):
    return End(OK, "done")
  if isinstance(event, Preempted):
    if left <= 0:
      return End(PREEMPTED, f"{event.task} preempted; backups saved")
    return RestartCluster(left - 1, "training resumes from the step its backup holds")
  if isinstance(event, EvaluatorHung):
    if left <= 0:
      return End(TASK_FAILED, f"{event.task} {event.how}")
    return RestartTask(event.task, left - 1)
  if event.code == USAGE:  # tfdist refused the task's config or input: no restart mends it.
    return End(USAGE, f"{event.task} refused its config or input (exit code {USAGE}); a "
                      "restart would be refused alike")
  taken = dict(budget.task_restarts).get(event.task, 0)
  if taken < OWN_RESTARTS.get(event.task_type, 0):
    return RestartTask(event.task, left, own=taken + 1)
  spent = budget.task_spent(event.task)
  if left > 0 and not spent:
    if event.alone:
      return RestartTask(event.task, left - 1)
    return RestartCluster(left - 1, "training resumes from its backup")
  if budget.min_workers is not None and event.task in budget.workers and \
      event.task != budget.anchor:
    remaining = len(budget.workers) - 1
    if remaining >= budget.min_workers:
      return GoOnWithout((event.task,), left)
    lost = ", ".join((*budget.lost, event.task))
    return End(TASK_FAILED, f"{lost} lost: {remaining} worker(s) remain, fewer than "
                            f"--min-workers {budget.min_workers}")
  if spent:
    return End(TASK_FAILED, f"{event.task} {event.how}; its failures caused the "
                            f"{budget.max_task_restarts} restart(s) one task may cause "
                            "(--max-restarts-per-task)")
  return End(TASK_FAILED, f"{event.task} {event.how}")
