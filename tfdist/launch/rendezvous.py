"""Per-host launches agree on their members through the chief's launcher, as torchrun's c10d
rendezvous hosts its store in the first agent: the chief's launcher keeps the rounds (which
configured workers are in) and hears the others; every other launcher joins, follows the rounds
and reports its task's failures. A round is the cluster for one start of the tasks.

The chief's launcher decides (`decisions.decide`): a failure reported, a launcher that left or
went silent, a launcher back (`Host.joined`); each of its decisions that changes who runs or
restarts them is a new round, and its end is the last. Small JSON over HTTP on the chief's host
(`tfdist launch --rendezvous-port`), one request a poll.

```python
host = Host("127.0.0.1:29400", workers=("worker-0", "worker-1", "worker-2"), silence=60)
client = Client("127.0.0.1:29400", "worker-2")
client.join()                      # Round(number=0, lost=(), ended=None)
host.publish(lost=("worker-2",))   # round 1 goes on without worker-2
client.poll().lost                 # ("worker-2",)
host.close()
```
"""

from __future__ import annotations

import dataclasses
import hmac
import http.server
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable

from tfdist.config.tf_config import split_address
from tfdist.errors import ConfigError
from tfdist.launch.decisions import Failed, Left, Preempted

_TIMEOUT = 2.0  # Seconds a request to the chief's launcher may take.
HEARTBEAT_EVERY_S = 1.0
"""Seconds between a member launcher's heartbeats (`Client.keep_alive`): a thread of its own,
so they go on while the launcher stops or starts its tasks."""
SECRET_ENV = "TFDIST_RENDEZVOUS_SECRET"
"""The per-run secret every launcher of a job shares (set on every host, as Ray's and Dask's
cluster tokens are): each request carries it, and the chief's launcher refuses one without it,
changing nothing. Unset, the rendezvous hears any caller that reaches its port."""
_SECRET_HEADER = "X-Tfdist-Rendezvous-Secret"
SILENCE_S = 10.0
"""Seconds without a heartbeat after which the chief's launcher counts a member's host as lost:
ten missed beats, and no task's grace period in it (a launcher's beats go on while its task
stops)."""


@dataclasses.dataclass(frozen=True)
class Round:
  """One start of the cluster: its number, the configured workers it runs without (their
  names in the config), once the launch ended its (exit code, reason), and whether it is open:
  every member's launcher stopped its tasks of the rounds before (a task starts only then: an
  old task's server would take the new one's peers)."""
  number: int
  lost: tuple[str, ...] = ()
  ended: tuple[int, str] | None = None
  open: bool = True

  def to_json(self) -> dict:
    return {"number": self.number, "lost": list(self.lost),
            "ended": list(self.ended) if self.ended else None, "open": self.open}

  @classmethod
  def from_json(cls, data: dict) -> "Round":
    return cls(int(data["number"]), tuple(data["lost"]),
               tuple(data["ended"]) if data["ended"] else None, bool(data["open"]))


class Host:
  """The rendezvous in the chief's launcher: serves the rounds on `address` and collects what
  the other launchers say.

  Args:
    address: host:port to serve on (the chief's host, `--rendezvous-port`).
    workers: the configured workers' names.
    silence: seconds a member's launcher may go without a poll before it counts as gone.
    name: the task the chief's launcher runs itself.
    clock: seconds, monotonic: when polls are heard and silence is judged (tests pass their
      own).
    secret: the job's shared secret (`SECRET_ENV`): a request without it is answered 401 and
      changes nothing; None hears every caller.
  """

  def __init__(self, address: str, workers: tuple[str, ...], silence: float,
               name: str = "worker-0", clock: Callable[[], float] = time.monotonic,
               secret: str | None = None):
    self.address = address
    self.secret = secret
    self.clock = clock
    self.workers = workers
    self.silence = silence
    self.name = name
    self._lock = threading.Lock()
    self._round = Round(0)
    self._ready: dict[str, int] = {}  # The newest round each launcher stopped its tasks for.
    self._inbox: list = []  # Failed, Preempted and Left events, in arrival order.
    self._seen: dict[str, float] = {}
    self._quiet: set[str] = set()  # Members whose launcher said it left or is done.
    self._joined: dict[str, float] = {}  # Lost workers whose launcher is back: when.
    host, port = split_address(address)
    self._server = http.server.ThreadingHTTPServer((host, port), _handler(self))
    self._server.daemon_threads = True
    threading.Thread(target=self._server.serve_forever, daemon=True).start()

  @property
  def round(self) -> Round:
    with self._lock:
      return self._round

  def publish(self, lost: tuple[str, ...], ended: tuple[int, str] | None = None) -> Round:
    """A new round without `lost` (or the launch's end): every launcher follows it; the round
    opens once every member's launcher (this one too: `ready`) stopped its tasks."""
    with self._lock:
      self._round = Round(self._round.number + 1, tuple(lost), ended, open=False)
      self._joined = {n: t for n, t in self._joined.items() if n in lost}
      # Silence is counted from here for every member, heard since or not: a host lost
      # without a word is never waited on (it would never say it stopped its task).
      now = self.clock()
      self._seen = {m: now for m in self.workers
                    if m not in lost and m != self.name and m not in self._quiet}
      return self._round

  def events(self) -> list:
    """What the other launchers said since the last call, and members gone silent."""
    now = self.clock()
    with self._lock:
      events, self._inbox = self._inbox, []
      for name, seen in list(self._seen.items()):
        if now - seen > self.silence and name not in self._round.lost and name != self.name:
          events.append(Left((name,), f"its launcher went silent ({now - seen:.0f} s without "
                                      "a poll: its host is lost)"))
          del self._seen[name]
    return events

  def ready(self, timeout: float) -> bool:
    """This launcher stopped its tasks: waits up to `timeout` seconds for the round to open
    (every member's launcher stopped its own); whether it did."""
    deadline = time.monotonic() + timeout
    self._poll(self.name, join=False, ready=self.round.number)
    while not self.round.open:
      if time.monotonic() >= deadline:
        return False
      time.sleep(0.1)
    return True

  def joined(self) -> dict[str, float]:
    """{lost worker whose launcher is back: when it joined (monotonic)}."""
    with self._lock:
      return dict(self._joined)

  def close(self) -> None:
    self._server.shutdown()
    self._server.server_close()

  # -- what the other launchers say ------------------------------------------------------------

  def _poll(self, name: str, join: bool, ready: int = -1) -> Round:
    with self._lock:
      if name not in self.workers and name != self.name:  # Not a member's launcher: read only.
        return self._round
      if join:
        self._quiet.discard(name)  # Back after it left.
      if name in self._round.lost:
        if join:
          self._joined.setdefault(name, self.clock())
      elif name not in self._quiet:  # A heartbeat in flight as it left is no sign of life.
        self._seen[name] = self.clock()
        self._ready[name] = max(self._ready.get(name, -1), ready)
      number = self._round.number
      members = [w for w in self.workers if w not in self._round.lost]
      if not self._round.open and all(self._ready.get(m, -1) >= number
                                      for m in {*members, self.name}):
        self._round = dataclasses.replace(self._round, open=True)
      return self._round

  def _said(self, body: dict) -> None:
    with self._lock:
      if body.get("round", self._round.number) != self._round.number:
        return  # About a round already replaced.
      name = str(body.get("name"))
      if name not in self.workers:
        return  # Not a worker's launcher.
      if body["what"] == "done":
        self._seen.pop(name, None)
        self._quiet.add(name)
      elif body["what"] == "left":
        self._inbox.append(Left((name,), "its launcher was stopped"))
        self._seen.pop(name, None)
        self._quiet.add(name)
      elif body["what"] == "preempted":
        self._inbox.append(Preempted(name))
      else:
        self._inbox.append(Failed(name, body.get("code"), str(body.get("how", "failed"))))


def _handler(host: Host):
  class Handler(http.server.BaseHTTPRequestHandler):
    def _refused(self) -> bool:
      """Answers 401 to a request without the job's secret (when it has one)."""
      given = self.headers.get(_SECRET_HEADER, "")
      if host.secret is None or hmac.compare_digest(given.encode(), host.secret.encode()):
        return False
      self._answer({"error": f"the {_SECRET_HEADER} header must be this job's secret "
                             f"({SECRET_ENV}); the request changed nothing"}, 401)
      return True

    def do_GET(self):  # pylint: disable=invalid-name
      if self._refused():
        return
      query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
      name = query.get("name", [""])[0]
      try:
        ready = int(query.get("ready", ["-1"])[0])
      except ValueError:
        ready = -1
      self._answer(host._poll(name, join=query.get("join") == ["1"], ready=ready).to_json())

    def do_POST(self):  # pylint: disable=invalid-name
      if self._refused():
        return
      try:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        what = body["what"]
      except (ValueError, KeyError, TypeError):
        self._answer({"error": "expected a JSON object with what and name"}, 400)
        return
      if what in ("done", "left", "preempted", "failed"):
        host._said(body)
      self._answer({"ok": True})

    def _answer(self, data: dict, status: int = 200) -> None:
      payload = json.dumps(data).encode()
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(payload)))
      self.end_headers()
      self.wfile.write(payload)

    def log_message(self, *args):  # Quiet: the launcher says what matters.
      del args
  return Handler


class Client:
  """A launcher's side of the rendezvous: it joins, polls the rounds and reports.

  Args:
    address: the chief's launcher's host:port.
    name: this launcher's task, as the config names it ("worker-2").
    secret: the job's shared secret (`SECRET_ENV`), sent with every request.
  """

  def __init__(self, address: str, name: str, secret: str | None = None):
    self.address = address
    self.name = name
    self._headers = {_SECRET_HEADER: secret} if secret else {}
    self._beating = threading.Event()

  def keep_alive(self, every: float = HEARTBEAT_EVERY_S) -> None:
    """Polls every `every` seconds from a thread of its own until `leave`: the chief's
    launcher hears this host while its launcher is busy stopping or starting its tasks."""
    self._beating.set()

    def beat():
      while self._beating.is_set():
        try:
          self._get(join=False, ready=-1)
        except ConfigError:
          return  # Refused: the launcher's own join or poll says so.
        time.sleep(every)
    threading.Thread(target=beat, name="tfdist-rendezvous-heartbeat", daemon=True).start()

  def join(self) -> Round | None:
    """Says this launcher is here (and has no task running); the current round, or None if
    the chief's is not up."""
    return self._get(join=True, ready=-1)

  def poll(self, ready: int = -1) -> Round | None:
    """The current round; None if the chief's launcher does not answer. `ready`: this
    launcher stopped its tasks for round `ready`."""
    return self._get(join=False, ready=ready)

  def report(self, event, round_number: int) -> None:
    """This launcher's task failed or was preempted in round `round_number`."""
    what = "preempted" if isinstance(event, Preempted) else "failed"
    self._post({"what": what, "name": self.name, "round": round_number,
                "code": getattr(event, "code", None), "how": getattr(event, "how", "")})

  def leave(self, done: bool = False) -> None:
    """This launcher is stopping (a signal): the others go on without it; `done`: its task
    finished training (its silence is no loss)."""
    self._beating.clear()
    self._post({"what": "done" if done else "left", "name": self.name})

  def _get(self, join: bool, ready: int) -> Round | None:
    query = urllib.parse.urlencode({"name": self.name, "ready": ready,
                                    **({"join": "1"} if join else {})})
    request = urllib.request.Request(f"http://{self.address}/round?{query}",
                                     headers=self._headers)
    try:
      with urllib.request.urlopen(request, timeout=_TIMEOUT) as answer:
        return Round.from_json(json.load(answer))
    except urllib.error.HTTPError as e:
      self._refusal(e)
      return None
    except (OSError, ValueError, KeyError):
      return None

  def _post(self, body: dict) -> None:
    request = urllib.request.Request(f"http://{self.address}/said", json.dumps(body).encode(),
                                     {"Content-Type": "application/json", **self._headers})
    try:
      urllib.request.urlopen(request, timeout=_TIMEOUT).close()
    except urllib.error.HTTPError as e:
      self._refusal(e)
    except OSError:
      pass  # The chief's launcher is gone: the next poll says so.

  def _refusal(self, error: urllib.error.HTTPError) -> None:
    """Raises ConfigError naming the secret when the chief's launcher refused this one's."""
    if error.code == 401:
      raise ConfigError(f"the chief's launcher at {self.address} refused this launcher: "
                        f"{SECRET_ENV} must be the same on every host of the job",
                        key=SECRET_ENV, received="set" if self._headers else "unset")
