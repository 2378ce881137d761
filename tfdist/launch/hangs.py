"""A hang told from a slow run, and the task behind it named: the launcher's reading of its
tasks' training progress (`tfdist.progress`, written into each heartbeat file once a second).

A hang is a cluster whose training has not progressed (no task moved to another phase, drew a
batch or finished a call, nor a coordinator's worker a scheduled call) for the deadline. The
task behind it is, in order:

1. a task running its own code (`Phase.OWN`: a callback, its loop's body; `Phase.EPOCH_END`:
   its epoch's end) while its peers wait for it (in a call or a collective), or for the
   deadline with no peer waiting;
2. with every task waiting, a coordinator's worker holding a call that never ends
   (parameter-server training), the task behind the others (in an earlier call), or the
   one whose input stopped delivering batches in the call the others wait in;
3. else every task waits in the same call: a peer on another host, or a collective that never
   completes;
4. a task waiting in a call or collective its peers never entered: they ended training (a
   chief-only `model.predict` after fit).

An epoch's end has its own, longer deadline. Start-up (until every task finished its first
call: connecting, tracing) and a task's end (`Phase.DONE`) are not judged: the start-up
deadline and the exit barrier's own time-out are theirs, unless a peer waits in a collective
meanwhile (4). Pure: the supervisor feeds it the time
and the tasks' progress.

```python
watch = HangWatch(Deadlines())           # both derived from the run's own times
hang = watch.observe(now, {"worker-0": progress_0, "worker-1": progress_1})
```
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping

from tfdist.progress import WAITS_FOR_PEERS, Collective, Phase

SLOWEST_TIMES = 10  # A derived deadline: this many times the slowest such phase so far.
HANG_FLOOR_S = 60.0
EPOCH_END_FLOOR_S = 600.0
HANG_DEFAULT = (f"max({SLOWEST_TIMES} x the slowest call or gap between calls so far, "
                f"{HANG_FLOOR_S:g} s)")
"""The hang deadline's default, as every help text and page says it."""
EPOCH_END_DEFAULT = (f"max({SLOWEST_TIMES} x the slowest epoch end so far, "
                     f"{EPOCH_END_FLOOR_S:g} s)")
"""The epoch-end deadline's default, as every help text and page says it."""


@dataclasses.dataclass(frozen=True)
class Deadlines:
  """Seconds without progress before a hang is named.

  Attributes:
    hang: anywhere but an epoch's end (`--hang-timeout`); None: `HANG_DEFAULT`.
    epoch_end: a task at its epoch's end (`--epoch-end-timeout`); None: `EPOCH_END_DEFAULT`.
  """
  hang: float | None = None
  epoch_end: float | None = None

  def of(self, phase: Phase, tasks: Mapping[str, dict]) -> tuple[float, str]:
    """The deadline for a task in `phase` (derived from `tasks`' times) and its flag."""
    if phase == Phase.EPOCH_END:
      return (self.epoch_end if self.epoch_end is not None else
              _derived(tasks, "slowest_epoch_end", EPOCH_END_FLOOR_S)), "--epoch-end-timeout"
    return (self.hang if self.hang is not None else
            _derived(tasks, "slowest", HANG_FLOOR_S)), "--hang-timeout"


def _derived(tasks: Mapping[str, dict], key: str, floor: float) -> float:
  slowest = max((float(p.get(key, 0)) for p in tasks.values()), default=0.0)
  return max(SLOWEST_TIMES * slowest, floor)


@dataclasses.dataclass(frozen=True)
class Hang:
  """What the launcher names.

  Attributes:
    behind: the task named: the one the others wait for.
    waited: seconds without progress.
    where: where it is ("in on_train_batch_end callbacks", "in its input pipeline", ...).
    peers: its peers waiting for it, each (task, where it waits); empty when none waits.
    epoch: the task behind's epoch (0-based).
    step: the steps of that epoch the task behind has done.
    flag: the flag setting the deadline it ran past.
    every_task_waits: no task is behind: each waits in the same call.
    peer_elsewhere: some of the cluster's tasks are not watched here (another host's).
    never_entered: the tasks that ended their training (their script's end) without entering
      the collective `behind` waits in: one some workers entered and others not (a chief-only
      `model.predict`).
  """
  behind: str
  waited: float
  where: str
  peers: tuple[tuple[str, str], ...]
  epoch: int
  step: int
  flag: str = "--hang-timeout"
  every_task_waits: bool = False
  peer_elsewhere: bool = False
  never_entered: tuple[str, ...] = ()

  def describe(self) -> str:
    position = f"epoch {self.epoch + 1}, after step {self.step}"
    if self.never_entered:
      others = " and ".join(self.never_entered)
      return (f"hang: {self.behind} has waited {self.where} for {self.waited:.0f} s, which "
              f"{others} never entered: {'they' if len(self.never_entered) > 1 else 'it'} "
              "ended training and went on to its script's end. A collective called by some "
              "workers only: under a strategy of several workers each one calls Keras's "
              "predict, evaluate and a metric's result (each gets the whole result), not only "
              "the chief")
    if self.every_task_waits and self.peer_elsewhere:
      return (f"hang: every task here has waited {self.where} for {self.waited:.0f} s "
              f"({position}): a peer on another host never reached it, or its collective "
              "never completes")
    if self.every_task_waits:
      return (f"hang: every task has waited {self.where} for {self.waited:.0f} s "
              f"({position}), none behind another: a collective that never completes")
    if len(self.peers) == 1:
      waiting = ", while {} waits for it {}".format(*self.peers[0])
    else:
      waiting = (", while its peers wait for it: " +
                 ", ".join(f"{name} {place}" for name, place in self.peers)) if self.peers else ""
    return (f"hang: {self.behind} has been {self.where} for {self.waited:.0f} s without "
            f"progress ({position}){waiting}")


class HangWatch:
  """The hang deadlines over a cluster's training tasks.

  Args:
    deadlines: the `Deadlines` (default: both derived).
    whole_cluster: every training task of the cluster is watched here (one host's launch of
      them all); else a peer on another host may be the one behind.
  """

  def __init__(self, deadlines: Deadlines = Deadlines(), whole_cluster: bool = True):
    self.deadlines = deadlines
    self.whole_cluster = whole_cluster
    self._seen: tuple = ()
    self._since: float | None = None

  def observe(self, now: float, tasks: Mapping[str, dict | None]) -> Hang | None:
    """The hang, if `tasks` (each one's progress snapshot, None before its first beat) have
    made none for its deadline; else None."""
    known = {name: p for name, p in tasks.items() if p is not None}
    seen = tuple(sorted((n, p["moves"], p["begun"], p["finished"], p.get("drawn", 0),
                         tuple(sorted((k, tuple(v)) for k, v in p.get("remote", {}).items())))
                        for n, p in known.items()))
    if seen != self._seen or self._since is None or len(known) < len(tasks) or not known:
      self._seen, self._since = seen, now  # Progress, or not every task beats yet.
      return None
    phases = {n: Phase(p["phase"]) for n, p in known.items()}
    if any(p["finished"] < 1 for p in known.values()) or \
        any(phase == Phase.START for phase in phases.values()):
      return None  # Start-up and tracing: not judged.
    waited = now - self._since
    if (hang := self._never_entered(known, phases, waited)) is not None or \
        any(phase == Phase.DONE for phase in phases.values()):
      return hang  # A task's end is not judged, unless its peers wait in a call it left.
    waiting = sorted(n for n in known if phases[n] in WAITS_FOR_PEERS)
    peers = tuple((n, _place(known[n])) for n in waiting)
    for name in sorted(n for n in known if n not in waiting):  # Its own code.
      deadline, flag = self.deadlines.of(phases[name], known)
      if waited >= deadline:
        return self._hang(name, known[name], waited, known[name]["where"], peers, flag)
    if len(waiting) < len(known):
      return None
    deadline, flag = self.deadlines.of(Phase.CALL, known)
    if waited < deadline:
      return None
    for name in waiting:  # A coordinator waiting on a worker's call.
      stuck = sorted(int(i) for i, (begun, done) in known[name].get("remote", {}).items()
                     if begun > done)
      if stuck:
        return Hang(f"worker-{stuck[0]}", waited, f"running a call {name} scheduled",
                    ((name, _place(known[name])),), int(known[name]["epoch"]),
                    int(known[name]["step"]), flag)
    def position(n):
      return known[n]["begun"] + known[n]["finished"], known[n].get("drawn", 0)
    behind = min(waiting, key=position)
    if position(behind) != max(position(n) for n in waiting):
      where = ("waiting on its input pipeline" if
               position(behind)[0] == max(position(n)[0] for n in waiting) else
               _place(known[behind]))
      return self._hang(behind, known[behind], waited, where, peers, flag)
    if len(known) == 1 and self.whole_cluster:  # A task alone (an evaluator): its own call.
      return self._hang(behind, known[behind], waited, _place(known[behind]), (), flag)
    return Hang(behind, waited, _place(known[behind]), peers, int(known[behind]["epoch"]),
                int(known[behind]["step"]), flag, every_task_waits=True,
                peer_elsewhere=not self.whole_cluster)

  def _never_entered(self, known, phases, waited) -> Hang | None:
    """Tasks waiting in a call or collective past the deadline while every other ended its
    training (its script's end, or tfdist's exit barrier there): a collective they never
    entered."""
    ended = tuple(sorted(n for n in known if phases[n] == Phase.DONE or
                         known[n]["where"] == Collective.EXIT_BARRIER.value))
    waiting = sorted(n for n in known if phases[n] in WAITS_FOR_PEERS and n not in ended)
    deadline, flag = self.deadlines.of(Phase.CALL, known)
    if not ended or not waiting or len(waiting) + len(ended) < len(known) or waited < deadline:
      return None
    name = waiting[0]
    return Hang(name, waited, _place(known[name]),
                tuple((n, _place(known[n])) for n in waiting[1:]), int(known[name]["epoch"]),
                int(known[name]["step"]), flag, never_entered=ended)

  @staticmethod
  def _hang(name, task, waited, where, peers, flag) -> Hang:
    return Hang(name, waited, where, tuple(p for p in peers if p[0] != name),
                int(task["epoch"]), int(task["step"]), flag)


def _place(task: dict) -> str:
  """Where a waiting task waits: "in call 6", "in the preemption agreement"."""
  if task["phase"] == Phase.CALL.value:
    what = f" ({task['where']})" if task.get("where") else ""
    return f"in call {task['begun']}{what}"
  return f"in {task['where']}"


_UNHEALTHY = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")
_COORDINATION_LOST = ("stopped sending heartbeats", "The tasks have crashed")
# A collective aborted because a peer's server no longer answers (its process killed, its host
# gone): gRPC names the peer it called, "from remote target /job:worker/replica:0/task:2".
_UNREACHABLE = re.compile(r"from remote target /job:(\w+)/replica:\d+/task:(\d+)[^\n]*\n"
                          r"[^\n]*(?:failed to connect to all addresses|Connection refused|"
                          r"Socket closed|Connection reset by peer)")


def lost_peers(log_tail: str, own: str) -> list[str]:
  """The peers TensorFlow's coordination service says were lost (no heartbeats: a host cut
  off, a process killed elsewhere), or that a collective could not reach (its server gone:
  "failed to connect to all addresses" from that remote target), named as tasks
  (`worker-1`), from the end of task `own`'s log; empty when it says none. Pure.

  >>> lost_peers("... unhealthy (stopped sending heartbeats):\\n/job:worker/replica:0/task:1\\n"
  ...            "The tasks have crashed.", "worker-0")
  ['worker-1']
  >>> lost_peers("Additional GRPC error information from remote target /job:worker/replica:0/"
  ...            "task:2 while calling /tensorflow.WorkerService/RecvBuf:\\n:UNKNOWN:Error "
  ...            "received from peer {grpc_message:\\"failed to connect to all addresses\\"}",
  ...            "worker-0")
  ['worker-2']
  """
  unreachable = [f"{job}-{index}" for job, index in _UNREACHABLE.findall(log_tail)]
  if not any(marker in log_tail for marker in _COORDINATION_LOST):
    return [name for name in dict.fromkeys(unreachable) if name != own]
  at = max(log_tail.rfind(marker) for marker in _COORDINATION_LOST)
  window = log_tail[max(at - 2000, 0):at + 2000]
  names = dict.fromkeys([*(f"{job}-{index}" for job, index in _UNHEALTHY.findall(window)),
                         *unreachable])
  return [name for name in names if name != own]
