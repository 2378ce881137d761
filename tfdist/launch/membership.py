"""Who runs: the seam between the supervisor's one watch loop and the other launchers of a
launch, as torchrun's RendezvousHandler. Three kinds, one interface:

- `Alone`: this launcher runs every task it decides on.
- `Hosting`: it runs the chief and keeps the rendezvous (`rendezvous.Host`): what the other
  launchers report, a member gone silent or back, are events; each decision that changes who
  runs is published as a round, which opens once every member stopped its tasks.
- `Following`: it follows the chief's launcher's rounds (`rendezvous.Client`): its task's
  failure is reported; a new round, the end, or the chief's launcher gone silent is an event.

A membership decides nothing: `poll` reports an event (or that the awaited round opened) into
the supervisor's loop, which decides, and `decided` tells it the action. Its waits are the
loop's states: JOINING (a following launcher awaits the round that takes it in) and WAITING
(this launcher's tasks are stopped: the round opening, or the chief's decision).

```python
membership = Alone()
membership.poll(State.WAITING, epoch=lambda: None)    # OPENED: nothing to wait for
```
"""

from __future__ import annotations

import time
from typing import Callable

from tfdist.exit_codes import TASK_FAILED
from tfdist.launch.decisions import (Action, Event, FollowRound, GoOnWithout, Grow, HostBack,
                                     NewRound, Report, RestartCluster, State)

POLL_EVERY = 0.5  # Seconds between a following launcher's polls of the chief's rounds.
_END_SEEN = 1.5  # Seconds the chief's launcher serves its last round before it ends.
_NEW_ROUND = (RestartCluster, GoOnWithout, Grow)  # The chief's actions that change who runs.


class Opened:
  """The round this launcher waited for opened: start its tasks."""

  def __repr__(self) -> str:
    return "OPENED"


OPENED = Opened()


class Alone:
  """A launcher that decides for itself: nothing to wait for, no one to tell. `say` writes one
  of the launcher's lines (the supervisor sets its own)."""
  follows: str | None = None  # The task whose failures are the chief's to decide.
  anchor: str | None = None  # The task never dropped (its launcher keeps the rendezvous).
  round: int | None = None  # The round this launcher runs (None: no rounds).
  first_state = State.WAITING
  say: Callable[[str], None] = staticmethod(lambda line: None)

  def poll(self, state: State, epoch: Callable[[], float | None]) -> Event | Opened | None:
    """The next event, `OPENED` once the awaited round opened, or None.

    Args:
      state: the supervisor's state.
      epoch: returns the furthest epoch this launcher's training tasks reached (None before
        one trains).
    """
    del epoch
    return OPENED if state is State.WAITING else None

  def decided(self, event: Event, action: Action, lost: tuple[str, ...]) -> None:
    """The supervisor's action on `event`; `lost`: the workers it now runs without."""

  def leaving(self) -> None:
    """A stop signal reached this launcher: before its tasks stop."""

  def ended(self, code: int, message: str, lost: tuple[str, ...]) -> None:
    """The launch ends with `code`."""


class Hosting(Alone):
  """The chief's launcher, keeping the rendezvous.

  Args:
    host: the `rendezvous.Host` it serves.
    patience: seconds a new round waits for a member alive that does not stop its task (the
      grace period and the heartbeat timeout) before it starts anyway.
  """

  def __init__(self, host, patience: float):
    self.host, self.patience = host, patience
    self.anchor = host.name
    self.round = 0
    self._inbox: list = []
    self._joined_at: dict[str, float] = {}  # Launchers back: the epoch then.
    self._opening_since: float | None = None  # The published round awaits every member.

  def poll(self, state: State, epoch: Callable[[], float | None]) -> Event | Opened | None:
    self._inbox += self.host.events()
    if self._inbox:
      return self._inbox.pop(0)
    if state is State.WAITING:
      return self._opening()
    if state in (State.STARTING, State.RUNNING) and (reached := epoch()) is not None:
      return self._back(reached)
    return None

  def decided(self, event: Event, action: Action, lost: tuple[str, ...]) -> None:
    if isinstance(action, _NEW_ROUND):  # Every launcher stops its tasks and starts this one.
      self.round = self.host.publish(lost).number
      self._joined_at = {}
      if self._opening_since is None:
        self._opening_since = time.monotonic()

  def ended(self, code: int, message: str, lost: tuple[str, ...]) -> None:
    # The others end with it: they see the last round, then it is gone.
    self.host.publish(lost, ended=(code, message))
    time.sleep(_END_SEEN)

  def _opening(self) -> Opened | None:
    """`OPENED` once every member's launcher stopped its tasks (or the patience ran out: one
    alive that does not stop its task is started beside); a member silent meanwhile is an
    event of `poll`, never waited on."""
    if self._opening_since is None or self.host.ready(POLL_EVERY):
      self._opening_since = None
      return OPENED
    if time.monotonic() - self._opening_since > self.patience:
      self.say(f"round {self.round}: not every launcher stopped its task in "
               f"{self.patience:g} s; starting")
      self._opening_since = None
      return OPENED
    return None

  def _back(self, epoch: float) -> HostBack | None:
    """Lost workers whose launcher joined again, once the training began an epoch since."""
    back = []
    for name in self.host.joined():
      if name not in self._joined_at:
        self._joined_at[name] = epoch
        self.say(f"{name}'s launcher is back: it is taken in when an epoch begins")
      elif epoch > self._joined_at[name]:
        back.append(name)
        self._joined_at[name] = float("inf")  # Offered once a round.
    return HostBack(tuple(back)) if back else None


class Following(Alone):
  """A launcher that follows the chief's launcher's rounds.

  Args:
    client: its `rendezvous.Client`.
    silence: seconds without an answer from the chief's launcher after which the launch ends
      (`--heartbeat-timeout`).
    join_timeout: seconds the chief's launcher may take to come up (`--startup-timeout`).
  """
  first_state = State.JOINING

  def __init__(self, client, silence: float, join_timeout: float):
    self.client = client
    self.silence, self.join_timeout = silence, join_timeout
    self.follows = client.name
    self.round = 0
    self._began = self._answered = time.monotonic()
    self._polled = 0.0
    self._said_waiting = False
    self._awaiting_decision = False

  def poll(self, state: State, epoch: Callable[[], float | None]) -> Event | Opened | None:
    del epoch
    now = time.monotonic()
    if now - self._polled < POLL_EVERY:
      return None
    self._polled = now
    if state is State.JOINING:
      return self._join(now)
    if state is State.WAITING and not self._awaiting_decision:
      found = self.client.poll(ready=self.round)
      return self._new_round(found, now) or (OPENED if found is not None and found.open and
                                             found.number == self.round else None)
    return self._new_round(self.client.poll(), now)

  def decided(self, event: Event, action: Action, lost: tuple[str, ...]) -> None:
    if isinstance(action, Report):
      self.client.report(action.event, self.round)
      self.say(f"reported to the chief's launcher at {self.client.address}; waiting for its "
               "decision")
      self._awaiting_decision, self._answered = True, time.monotonic()
    elif isinstance(action, FollowRound):
      self.round, self._awaiting_decision = action.number, False

  def leaving(self) -> None:
    self.client.leave()  # Before its task saves with the others: they go on without it.

  def ended(self, code: int, message: str, lost: tuple[str, ...]) -> None:
    if code == 0:
      self.client.leave(done=True)

  def _join(self, now: float) -> NewRound | None:
    """Joins the chief's rounds (its launcher may start after this one); while the round runs
    without this launcher's task (back after being lost), waits to be taken in."""
    found = self.client.join()
    if found is None:
      if now - self._began > self.join_timeout:
        return NewRound(self.round, (), (TASK_FAILED, (
            f"the chief's launcher at {self.client.address} did not answer in "
            f"{self.join_timeout:g} s (--startup-timeout)")))
      return None
    if found.ended is not None:
      return NewRound(found.number, found.lost, found.ended)
    if self.client.name in found.lost:
      if not self._said_waiting:
        self.say(f"{self.client.name} joined the chief's launcher at {self.client.address}; "
                 f"round {found.number} runs without it: waiting to be taken in when an epoch "
                 "begins")
        self._said_waiting = True
      return None
    self._answered = now
    return NewRound(found.number, found.lost)  # Followed (`decided`), then its opening awaited.

  def _new_round(self, found, now: float) -> NewRound | None:
    """A round newer than this launcher's, or the end when the chief's launcher stopped
    answering for longer than `silence`."""
    if found is None:
      if now - self._answered > self.silence:
        return NewRound(self.round + 1, (), (TASK_FAILED, (
            f"the chief's launcher at {self.client.address} has not answered for "
            f"{now - self._answered:.0f} s")))
      return None
    self._answered = now
    return NewRound(found.number, found.lost, found.ended) if found.number > self.round \
        else None

