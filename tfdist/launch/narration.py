"""What the launcher says about its plan and each decision: pure functions from what happened
to the line, so every line is tested without processes.

```python
decision_line(Failed("worker-2", 1, "failed (exit code 1)"), RestartCluster(1, "training "
              "resumes from its backup"), Members(("worker-0", "worker-1", "worker-2")))
# 'restarting the whole cluster (1 restart(s) left after this); training resumes from ...'
```
"""

from __future__ import annotations

import dataclasses

from tfdist.config.schema import OWN_RESTARTS
from tfdist.exit_codes import PREEMPTED, USAGE
from tfdist.launch.decisions import (Action, AllDone, Continue, End, Event, EvaluatorHung,
                                     Failed, FollowRound, GoOnWithout, Grow, Left, NewRound,
                                     Report, RestartCluster, RestartTask, StopAsked)
from tfdist.launch.plan import LaunchPlan


@dataclasses.dataclass(frozen=True)
class Members:
  """Who a launch runs: the configured workers, those lost, `--min-workers`."""
  workers: tuple[str, ...]
  lost: tuple[str, ...] = ()
  min_workers: int | None = None

  def now(self, lost: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The configured workers without `lost` (default: those lost so far)."""
    lost = self.lost if lost is None else lost
    return tuple(w for w in self.workers if w not in lost)


def decision_line(event: Event, action: Action, members: Members,
                  spent: bool = False) -> str | None:
  """The line the launcher says on deciding `action` about `event` (None: nothing to say).

  Args:
    event: what a detector saw.
    action: what `decisions.decide` chose.
    members: the membership before the action.
    spent: the failed task had caused the restarts one task may cause
      (`Budget.task_spent`, `--max-restarts-per-task`).

  Returns:
    The line, or None.
  """
  left = f"{getattr(action, 'restarts_left', 0)} restart(s) left"
  if isinstance(action, RestartCluster):
    return f"restarting the whole cluster ({left} after this); {action.why}"
  if isinstance(action, RestartTask):
    again = "; it evaluates the checkpoints again" if isinstance(event, EvaluatorHung) else ""
    if action.own:
      role = getattr(event, "task_type", "task")
      return (f"restarting {action.task} alone (its own restart {action.own} of "
              f"{OWN_RESTARTS[role]}: a {role} holds no training state; --max-restarts "
              "untouched)")
    return f"restarting {action.task} alone ({left}){again}"
  if isinstance(action, GoOnWithout):
    remaining = len(members.now()) - len(action.tasks)
    why = (f"left ({event.why})" if isinstance(event, Left) else
           "failed again past --max-restarts-per-task" if spent else
           "failed with no restarts left")
    return (f"{', '.join(action.tasks)} {why}: going on without it, {remaining} worker(s) "
            f"(--min-workers {members.min_workers}); training resumes from its backup with the "
            "same global batch")
  if isinstance(action, Grow):
    count = len(members.now()) + len(action.tasks)
    return (f"{', '.join(action.tasks)} is back: taking it in as an epoch begins, {count} "
            f"worker(s) ({left}); training resumes from its backup with the same global batch")
  if isinstance(action, Continue):
    return action.why
  if isinstance(action, FollowRound):
    return (f"the chief's launcher started round {action.number}: "
            f"{', '.join(members.now(action.lost))}")
  if isinstance(event, AllDone):
    return "every task finished: done"
  if isinstance(event, StopAsked) and event.preempted:
    return f"every task saved its backup: exiting with {PREEMPTED} (restart to resume)"
  if isinstance(event, NewRound) and isinstance(action, End):
    return (f"the chief's launcher ended the launch: {action.message}" if event.ended else
            action.message)
  if isinstance(event, (Failed, EvaluatorHung)) and not isinstance(action, Report):
    if isinstance(action, End) and action.code == USAGE:
      return "a usage error, which no restart mends: stopping every task"
    if spent:
      return f"{event.task} may cause no more restarts (--max-restarts-per-task): stopping " \
             "every task"
    return "no restarts left (--max-restarts): stopping every task"
  return None


def plan_lines(plan: LaunchPlan, shown: LaunchPlan | None, *, runs_chief: bool, verbose: bool,
               members: Members, round_number: int | None) -> list[str]:
  """The whole plan at the first start; at a restart, only what changed (with rounds, the
  round's members and this host's tasks).

  Args:
    plan: the plan about to start.
    shown: the plan said last, None at the first start.
    runs_chief: whether this launcher runs the chief's task.
    verbose: whether every task's output is shown.
    members: who the launch runs now.
    round_number: the round this launcher runs (a per-host elastic launch), else None.

  Returns:
    The lines to say.
  """
  if shown is None:  # Each task's command and environment with --verbose (--dry-run too).
    lines = [plan.describe(commands=verbose)]
    if runs_chief and not verbose and len(plan.processes) > 1:
      lines.append("showing the chief's output; every task's is in its log (--verbose shows "
                   "all)")
    return lines
  if round_number is not None:  # This host runs one task; the round says who is in.
    gone = [w for w in members.workers if w in members.lost]
    return [f"round {round_number}: {', '.join(members.now())}" +
            (f" (without {', '.join(gone)})" if gone else "") +
            f"; this host runs {', '.join(p.name for p in plan.processes)}"]
  before = {p.name for p in shown.processes}
  now = [p.name for p in plan.processes]
  gone = sorted(before - set(now))
  if members.lost:  # Named as the config names them: the workers after one lost renumbered.
    configured = members.now()
    now = [f"{name} (was {configured[index]})"
           if name.startswith("worker-") and configured[index := int(name[7:])] != name
           else name for name in now]
    gone = list(members.lost)
  return [f"the plan again: {', '.join(now)}" + (f" (without {', '.join(gone)})" if gone
                                                 else "") + ", on new ports where picked"]
