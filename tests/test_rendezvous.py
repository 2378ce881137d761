"""The per-host rendezvous (`tfdist.launch.rendezvous`) over its own HTTP, against the rules
written out here: rounds, joins of lost workers, reports of the current round only, a launcher
that leaves or goes silent, one done. Silence is judged on a clock the test moves."""

import pytest

from tfdist.launch.decisions import Failed, Left, Preempted
from tfdist.launch.rendezvous import Client, Host, Round
from tfdist.machine.ports import free_ports

WORKERS = ("worker-0", "worker-1", "worker-2")


class Clock:
  """Seconds that pass only when the test says."""

  def __init__(self):
    self.now = 1000.0

  def __call__(self) -> float:
    return self.now


@pytest.fixture
def clock():
  return Clock()


@pytest.fixture
def host(clock):
  (port,) = free_ports(1)
  served = Host(f"127.0.0.1:{port}", WORKERS, silence=10.0, clock=clock)
  yield served
  served.close()


def test_launchers_see_each_round_and_a_lost_worker_back_is_a_join(host):
  one, two = Client(host.address, "worker-1"), Client(host.address, "worker-2")
  assert one.join() == Round(0) and two.poll() == Round(0)
  host.publish(("worker-2",))
  assert one.poll() == Round(1, ("worker-2",), open=False)
  two.poll()  # A dropped launcher's last poll is no join.
  assert host.joined() == {}
  back = Client(host.address, "worker-2")
  assert back.join() == Round(1, ("worker-2",), open=False)
  assert list(host.joined()) == ["worker-2"]
  host.publish(())
  assert host.joined() == {} and back.poll() == Round(2, open=False)
  host.publish((), ended=(0, "done"))
  assert one.poll() == Round(3, (), (0, "done"), open=False)


def test_a_round_opens_once_every_members_launcher_stopped_its_tasks(host):
  """An old task's server would take its new peers' connections: no task of a round starts
  before every member's launcher stopped its own."""
  one, two = Client(host.address, "worker-1"), Client(host.address, "worker-2")
  host.publish(())
  assert not host.ready(timeout=0.2)  # The chief's launcher stopped; the others not yet.
  assert not one.poll(ready=1).open
  assert not two.poll(ready=0).open  # Still stopping its round-0 task.
  assert two.poll(ready=1).open and one.poll().open and host.ready(timeout=0)


def test_reports_of_the_current_round_reach_the_chief_and_stale_ones_do_not(host):
  one = Client(host.address, "worker-1")
  one.report(Failed("worker-1", 1, "failed (exit code 1)"), 0)
  one.report(Preempted("worker-1"), 0)
  assert host.events() == [Failed("worker-1", 1, "failed (exit code 1)"),
                           Preempted("worker-1")]
  host.publish(())
  one.report(Failed("worker-1", 1, "failed (exit code 1)"), 0)  # About round 0: stale.
  assert host.events() == []


def test_a_launcher_that_leaves_or_goes_silent_is_left_and_one_done_is_not(host, clock):
  one, two, three = (Client(host.address, w) for w in WORKERS)
  for client in (one, two, three):
    client.poll()
  one.leave()
  three.leave(done=True)
  assert host.events() == [Left(("worker-0",), "its launcher was stopped")]
  clock.now += 10  # At the silence, not past it.
  assert host.events() == []
  clock.now += 1  # worker-1 polls no more: past the silence, its host is lost.
  (event,) = host.events()
  assert event == Left(("worker-1",), "its launcher went silent (11 s without a poll: its host "
                                      "is lost)")
  assert host.events() == []


def test_a_launcher_that_polls_within_the_silence_is_never_lost(host, clock):
  one = Client(host.address, "worker-1")
  for _ in range(5):
    one.poll()
    clock.now += 9
    assert host.events() == []


def test_no_chief_launcher_is_none_not_an_error():
  (port,) = free_ports(1)
  assert Client(f"127.0.0.1:{port}", "worker-1").poll() is None


def test_a_request_from_no_members_launcher_changes_nothing(host, clock):
  import json
  import urllib.error
  import urllib.request
  stranger = Client(host.address, "worker-9")
  stranger.poll()
  stranger.leave()
  stranger.report(Failed("worker-9", 1, "failed"), 0)
  with urllib.request.urlopen(f"http://{host.address}/round") as answer:  # No name: read only.
    assert json.load(answer)["number"] == 0
  request = urllib.request.Request(f"http://{host.address}/said", b"not json")
  with pytest.raises(urllib.error.HTTPError) as refused:
    urllib.request.urlopen(request)
  assert refused.value.code == 400
  clock.now += 60  # Past the silence: no one it heard from is a member.
  assert host.events() == [] and host.joined() == {} and host.round == Round(0)


def test_a_host_lost_without_a_word_after_a_new_round_is_left_not_waited_on(host, clock):
  """Killed -9 with its task: it never polls after the round that restarts the cluster, so it
  never says it stopped its task; silence from the round's publish names it (issue 59)."""
  one, two = Client(host.address, "worker-1"), Client(host.address, "worker-2")
  one.poll(), two.poll()
  host.publish(())  # Restarting the whole cluster; worker-2's host is gone from here on.
  clock.now += 5
  one.poll(ready=1)
  assert host.events() == [] and not host.ready(timeout=0)
  clock.now += 6
  assert host.events() == [Left(("worker-2",), "its launcher went silent (11 s without a poll: "
                                               "its host is lost)")]
  host.publish(("worker-2",))
  one.poll(ready=2)
  assert host.ready(timeout=0)  # The round without it opens at once.


def test_a_launchers_heartbeat_keeps_it_heard_and_stops_when_it_leaves(host, clock):
  """`keep_alive` beats from a thread of its own (the launcher may be stopping its task); a
  beat in flight as it leaves is no sign of life."""
  import time
  one = Client(host.address, "worker-1")
  one.keep_alive(every=0.05)
  deadline = time.monotonic() + 30
  while "worker-1" not in host._seen and time.monotonic() < deadline:
    time.sleep(0.05)
  for _ in range(3):
    clock.now += 9
    heard = host._seen["worker-1"]
    while host._seen["worker-1"] == heard and time.monotonic() < deadline:
      time.sleep(0.05)
    assert host.events() == []
  one.leave(done=True)
  time.sleep(0.2)  # Beats that were in flight land.
  clock.now += 100
  assert host.events() == [] and "worker-1" not in host._seen


def test_with_a_secret_a_request_without_it_is_refused_and_changes_nothing(clock):
  """Any process reaching the port could post as worker-2 and shrink or stop the job: with the
  job's secret (TFDIST_RENDEZVOUS_SECRET on every host) only its launchers are heard."""
  import json
  import urllib.error
  import urllib.request
  from tfdist.errors import ConfigError
  (port,) = free_ports(1)
  host = Host(f"127.0.0.1:{port}", WORKERS, silence=10.0, clock=clock, secret="s3cret")
  try:
    member = Client(host.address, "worker-2", secret="s3cret")
    assert member.poll() == Round(0)
    for stranger in (Client(host.address, "worker-1"),
                     Client(host.address, "worker-1", secret="guess")):
      with pytest.raises(ConfigError, match=r"^TFDIST_RENDEZVOUS_SECRET: the chief's launcher "
                                            r"at .* refused this launcher: TFDIST_RENDEZVOUS_"
                                            r"SECRET must be the same on every host of the job"):
        stranger.join()
      with pytest.raises(ConfigError):
        stranger.leave()
      with pytest.raises(ConfigError):
        stranger.report(Failed("worker-1", 1, "failed"), 0)
    request = urllib.request.Request(f"http://{host.address}/said", json.dumps(
        {"what": "left", "name": "worker-2"}).encode(), {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
      urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401
    assert json.loads(refused.value.read())["error"].startswith(
        "the X-Tfdist-Rendezvous-Secret header must be this job's secret")
    assert host.events() == [] and "worker-1" not in host._seen
    clock.now += 11  # Only the member was heard: its silence alone counts.
    assert host.events() == [Left(("worker-2",), "its launcher went silent (11 s without a "
                                                 "poll: its host is lost)")]
  finally:
    host.close()
