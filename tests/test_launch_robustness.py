"""No task outlives its launcher, a frozen task is named as the root cause, output stays
readable: real 2-worker clusters launched through the CLI, killed, hung up on, frozen."""

import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

from tfdist.machine.ports import HeldPorts
from tests.conftest import PROGRAMS, REPO
from tests.launching import ENV, finish, read_until, running, start_launch

MWMS = "cluster: {worker: 2}\nstrategy: {name: multi_worker_mirrored, timeout_seconds: 30}\n"


def launch_steps(write_config, tmp_path, *flags, steps=0):
  path = write_config(MWMS)
  return start_launch(str(path), "--logs", str(tmp_path / "logs"), "--grace-period", "2",
                      "--verbose", *flags, "--", sys.executable, str(PROGRAMS / "steps.py"),
                      env={"STEPS": str(steps)})


def task_pids(process, seen):
  read_until(process, r"\[worker-1\] STEP 50", 120, seen)
  pids = dict(re.findall(r"\[(worker-\d)\] .*PID (\d+)", "".join(seen)))
  assert len(pids) == 2, "".join(seen)
  return [int(pids["worker-0"]), int(pids["worker-1"])]


def assert_all_gone(pids, within=15):
  deadline = time.monotonic() + within
  while time.monotonic() < deadline:
    alive = [p for p in pids if running(p)]
    if not alive:
      return
    time.sleep(0.2)
  for p in alive:
    os.kill(p, signal.SIGKILL)
  pytest.fail(f"tasks {alive} outlived their launcher by {within} s")


def test_a_launcher_killed_with_sigkill_takes_its_tasks_along(write_config, tmp_path):
  seen = []
  launcher = launch_steps(write_config, tmp_path)
  pids = task_pids(launcher, seen)
  os.kill(launcher.pid, signal.SIGKILL)  # The launcher alone: its tasks are in other sessions.
  launcher.wait(timeout=10)
  assert_all_gone(pids)


def test_a_closed_stdout_does_not_stop_the_launch_and_the_logs_are_plain_text(write_config,
                                                                              tmp_path):
  seen = []
  launcher = launch_steps(write_config, tmp_path, steps=400)
  pids = task_pids(launcher, seen)
  launcher.stdout.close()  # As `tfdist launch ... | head -3` does once head has its lines.
  assert launcher.wait(timeout=120) == 0
  assert_all_gone(pids)
  log = (tmp_path / "logs" / "worker-0.log").read_bytes()
  assert b"STEP 400" in log  # Kept logging to files after stdout was gone.
  assert f"PID {pids[0]}\n".encode() in log
  assert not re.search(rb"[\x1b\x08\r]", log)


def test_a_redrawn_progress_line_shows_and_logs_as_a_terminal_leaves_it(write_config,
                                                                          tmp_path):
  """Keras's progress bar redraws its line with carriage returns: a pipe and the log get the
  last redraw, not every redraw run together ("loss: 0.3116/16 ...")."""
  from tfdist.launch.liveness import last_redraw, plain_text
  assert last_redraw(b"\r 8/16 loss: 0.31\r16/16 loss: 0.28\r\n") == b"16/16 loss: 0.28\n"
  assert plain_text(b"\r\x1b[1m8/16\x1b[0m\r\x1b[1m16/16\x1b[0m - 2s\n") == b"16/16 - 2s\n"
  assert last_redraw(b"no redraw") == b"no redraw"
  assert plain_text(b"\x1b[1mPID 7\x1b[0m\r\x08\n") == b"PID 7\n"  # Nothing redrawn over it.
  path = write_config("strategy: default\n")
  launcher = start_launch(str(path), "--logs", str(tmp_path / "logs"), "--", sys.executable,
                          "-c", "print('\\r 8/16 loss: 0.31\\r\\x1b[1m16/16\\x1b[0m loss: 0.28'); "
                          "print('done')")
  output = finish(launcher, 60, [])
  assert launcher.returncode == 0, output
  assert "[local] 16/16 loss: 0.28\n[local] done\n" in output, output
  assert not re.search(r"\[local\].*0\.31", output), output
  log = (tmp_path / "logs" / "local.log").read_bytes()
  assert log.endswith(b"16/16 loss: 0.28\ndone\n"), log
  # On a terminal the bar stays live, each redraw keeping the task's prefix.
  import io
  from tfdist.launch import output

  class Terminal(io.StringIO):
    def isatty(self):
      return True

  assert output.Output(Terminal()).terminal
  assert output.terminal_line(b"\r 8/16\r16/16\n", "worker-0") == \
      b"\r[worker-0]  8/16\r[worker-0] 16/16\n"


def test_sighup_stops_the_cluster_like_sigterm(write_config, tmp_path):
  seen = []
  launcher = launch_steps(write_config, tmp_path)
  pids = task_pids(launcher, seen)
  os.kill(launcher.pid, signal.SIGHUP)  # A closed terminal or ssh session.
  output = finish(launcher, 30, seen)
  assert launcher.returncode == 128 + signal.SIGHUP
  assert "SIGHUP received: forwarded to every task" in output
  assert_all_gone(pids, within=2)


def test_a_frozen_worker_is_named_as_the_root_cause(write_config, tmp_path):
  seen = []
  launcher = launch_steps(write_config, tmp_path)
  pids = task_pids(launcher, seen)
  os.kill(pids[1], signal.SIGSTOP)
  try:
    output = finish(launcher, 120, seen)
  finally:
    for p in pids:
      if running(p):
        os.kill(p, signal.SIGKILL)
  assert launcher.returncode == 1, output[-3000:]
  assert re.search(r"worker-1 stopped making progress first \(no heartbeat for \d+ s, pid "
                   rf"{pids[1]}\): the root cause(; worker-0 failed \(exit code \d+\) after it)?",
                   output), output[-3000:]


def test_one_host_of_a_cluster_whose_peer_never_starts_fails_by_the_deadline_naming_it(
    write_config, tmp_path):
  # The ports are held (bound, never listening) throughout: with a suite beside it, another
  # test's server once took worker-1's port, so the peer "came up".
  with HeldPorts(2) as held:
    worker_0, worker_1 = (f"127.0.0.1:{p}" for p in held.ports)
    path = write_config(f'cluster: {{worker: ["{worker_0}", "{worker_1}"]}}\n'
                        "strategy: multi_worker_mirrored\n")
    # A grace period of 300 s: a task that never began training has no backup to save, so it
    # is stopped at once (issue 49: the launch waited the whole grace period).
    seen = []
    started = time.monotonic()
    launcher = start_launch(str(path), "--task", "worker:0", "--startup-timeout", "15",
                            "--grace-period", "300", "--logs", str(tmp_path / "logs"), "--",
                            sys.executable, "-c", "import tfdist, time; time.sleep(600)")
    read_until(launcher, "start-up deadline", 120, seen)
    named = time.monotonic()
    output = finish(launcher, 120, seen)  # Had it waited the grace period: TimeoutExpired.
    ended = time.monotonic()
  assert launcher.returncode == 3, output[-3000:]
  assert ended - named < 100, f"{ended - named:.1f} s from the deadline to the end"
  # "(10 s of 15 s)". On a loaded machine this host's own task may be slow to come up too, and
  # is then named first ("waiting for worker-0 at ..., worker-1 at ...").
  assert re.search(rf"waiting for (worker-0 at {worker_0}, )?worker-1 at {worker_1} \(1\d s of "
                   r"15 s\)", output), output[-3000:]
  assert re.search(rf"start-up deadline: (worker-0 at {worker_0}, )?worker-1 at {worker_1} did "
                   r"not come up in 15 s; stopping every task", output), output[-3000:]
  assert named - started < 100, named - started  # 15 s, not the default's 600 s.


def test_a_peer_slower_than_the_heartbeat_timeout_is_named_by_the_start_up_deadline(
    write_config, tmp_path):
  """This host's task waits for its peer inside TensorFlow, which holds the GIL there (the
  detector below), so its heartbeat stops: the start-up deadline, not the heartbeat, names the
  peer. (With the defaults, 120 s and 60 s, a peer 60 s slow named the waiting task frozen.)"""
  with HeldPorts(2) as held:  # Held throughout, as above.
    worker_0, worker_1 = (f"127.0.0.1:{p}" for p in held.ports)
    path = write_config(f'cluster: {{worker: ["{worker_0}", "{worker_1}"]}}\n'
                        "strategy: multi_worker_mirrored\n")
    launcher = start_launch(str(path), "--task", "worker:0", "--startup-timeout", "25",
                            "--heartbeat-timeout", "5", "--grace-period", "2", "--logs",
                            str(tmp_path / "logs"), "--", sys.executable, "-c",
                            "import tfdist, time; time.sleep(600)")
    output = finish(launcher, 90, [])
  assert launcher.returncode == 3, output[-3000:]
  assert f"worker-1 at {worker_1} did not come up in 25 s" in output, output[-3000:]
  assert "stopped making progress" not in output, output[-3000:]


def test_tensorflow_holds_the_gil_while_a_strategy_connects():
  """The detector of why the supervisor leaves heartbeats unjudged during start-up: when this
  fails, TensorFlow lets other Python threads run while MultiWorkerMirroredStrategy connects,
  and `Supervisor._watch` may judge heartbeats from the start again."""
  held = HeldPorts(2)  # Held throughout, as above.
  process = subprocess.Popen([sys.executable, str(PROGRAMS / "gil_while_connecting.py"),
                              *map(str, held.ports)], env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, start_new_session=True)
  try:
    read_until(process, r"^CONNECTING", 90, [])
    # Ticks every 0.1 s while the GIL is free; once the strategy waits for worker-1 holding it,
    # none. A loaded machine only delays that silence (its own start is slower).
    silent, after, deadline = False, "", time.monotonic() + 120
    while not silent and time.monotonic() < deadline:
      silent = not select.select([process.stdout], [], [], 10)[0]
      after += "" if silent else _drain(process)
  finally:
    os.killpg(process.pid, signal.SIGKILL)  # TensorFlow catches SIGTERM there.
    process.wait()
    held.close()
  assert "MADE" not in after
  assert silent, f"{after.count('TICK')} ticks in 120 s and never 10 s without: the GIL is free"


def test_a_task_waiting_in_the_exit_barrier_longer_than_the_heartbeat_timeout_is_not_named(
    write_config, tmp_path):
  """worker-0 works 15 s past worker-1's end (as a chief saving a model): worker-1 waits in
  tfdist's exit barrier, where TensorFlow holds the GIL, so its heartbeat stops. The launcher
  reads the wait the beat declared, not a frozen task (before: "worker-1 stopped making
  progress (no heartbeat for 4 s)", the run failed; a suite's loaded run named a task so after
  60 s). The detector half: worker-1's ticking thread prints nothing inside the wait; when it
  does, TensorFlow releases the GIL there and `progress.HOLDS_THE_GIL` can lose the barrier."""
  path = write_config("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
  launcher = start_launch(str(path), "--heartbeat-timeout", "4", "--grace-period", "2",
                          "--logs", str(tmp_path / "logs"), "--", sys.executable,
                          str(PROGRAMS / "gil_at_exit.py"))
  output = finish(launcher, 120, [])
  assert launcher.returncode == 0, output[-3000:]
  assert "stopped making progress" not in output, output[-3000:]
  log = (tmp_path / "logs" / "worker-1.log").read_text()
  waiting = float(re.search(r"WAITING ([\d.]+)", log)[1])
  ticks = [float(t) for t in re.findall(r"TICK ([\d.]+)", log)]
  # The wait lasts about 15 s (worker-0's sleep, from its own start); 5 s of it are enough.
  inside = [t for t in ticks if waiting + 1 < t < waiting + 6]
  assert not inside, f"{len(inside)} ticks inside the exit barrier: the GIL is free there"
  assert re.search(r"tfdist: this worker waited 1\d s at its end for the other workers to end "
                   r"theirs \(tfdist's exit barrier\)", log), log[-2000:]


def _drain(process) -> str:
  """What the process wrote since the last read, without waiting (read_until made its output
  non-blocking)."""
  chunks = []
  with contextlib.suppress(BlockingIOError):
    while chunk := os.read(process.stdout.fileno(), 1 << 16):
      chunks.append(chunk)
  return b"".join(chunks).decode()


def test_tensorflow_start_up_noise_is_turned_down(write_config, tmp_path):
  seen = []
  launcher = launch_steps(write_config, tmp_path, steps=50)
  output = finish(launcher, 120, seen)
  assert launcher.returncode == 0, output[-3000:]
  assert "oneDNN custom operations" not in output
  assert "All log messages before absl::InitializeLog()" not in output


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["launch", "--help"], ["launch", "-h"],
                                  ["export", "--help"], ["check", "-h"],
                                  ["cluster-server", "--help"], ["estimate", "--help"],
                                  ["model-export", "--help"]])
def test_help_lists_every_flag_with_its_default(args):
  result = subprocess.run([sys.executable, "-m", "tfdist", *args], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=60)
  assert result.returncode == 0, result.stderr
  if args[0].startswith("-"):
    assert "commands:" in result.stdout and "launch" in result.stdout
    return
  from tfdist.cli.main import COMMAND_FLAGS
  for name in COMMAND_FLAGS[args[0]]:
    assert re.search(rf"--{name}\b.*\(default: [^)]+\)", result.stdout), name
  if args[0] == "launch":
    for flag in ("--startup-timeout", "--grace-period", "--logs", "--keep-alive", "--fresh"):
      assert flag in result.stdout.split("flags:")[0]  # In the usage line too.


@pytest.mark.parametrize("old, new", [("serve", "cluster-server"), ("plan", "estimate"),
                                      ("export serving", "model-export")])
def test_a_renamed_command_still_runs_for_one_release_with_a_one_line_notice(old, new):
  result = subprocess.run([sys.executable, "-m", "tfdist", *old.split(), "--help"], cwd=REPO,
                          env=ENV,
                          capture_output=True, text=True, timeout=60)
  assert result.returncode == 0, result.stderr
  assert result.stderr == (f"tfdist: `tfdist {old}` is now `tfdist {new}`; the old name goes in "
                           "the next release\n")
  assert result.stdout.startswith(f"usage: tfdist {new} ")


def test_a_renamed_function_still_works_for_one_release_with_a_deprecation_warning():
  import tfdist
  with pytest.warns(DeprecationWarning, match="tfdist.serve is now tfdist.run_cluster_server"):
    assert tfdist.serve is tfdist.run_cluster_server
  with pytest.warns(DeprecationWarning, match="tfdist.start_server is now"):
    assert tfdist.start_server is tfdist.start_cluster_server


@pytest.mark.parametrize("beat,began", [
    ({"phase": "start", "drawn": 0}, False),  # Still connecting: no backup to save.
    ({"phase": "start", "drawn": 4}, True),  # Its input delivered: fit began, the beat is late.
    ({"phase": "call", "drawn": 4}, True),
])
def test_a_task_whose_input_delivered_gets_the_grace_period_though_its_beat_says_start(
    tmp_path, beat, began):
  """The heartbeat thread waits while TensorFlow holds the GIL in a first call: a beat saying
  "start" can be an epoch late. Measured in the per-host elastic test: the stopped host's task
  was SIGKILLed at once and lost the save its peers made."""
  import json
  from tfdist.launch import liveness, processes
  from tfdist.launch.plan import ProcessPlan
  path = tmp_path / ".worker-0.heartbeat"
  path.write_text(json.dumps(beat))
  plan = ProcessPlan(None, ("python",), ((liveness.HEARTBEAT_ENV, str(path)),),
                     str(tmp_path / "log"), False, None)
  assert processes.began_training(processes.Running(plan, None, None)) is began



def _running(tmp_path, code: str, serves: bool = False, env=()):
  """`python -c code` as a launched task (`processes.Running`) once it printed `up`."""
  from tfdist.launch import processes
  from tfdist.launch.plan import ProcessPlan
  plan = ProcessPlan(None, (sys.executable, "-c", code), env, str(tmp_path / "log"), serves, None)
  process = subprocess.Popen(plan.argv, stdout=subprocess.PIPE, start_new_session=True)
  assert process.stdout.readline() == b"up\n"
  pump = threading.Thread(target=process.stdout.read)
  pump.start()
  return processes.Running(plan, process, pump)


def test_a_stop_signals_the_servers_only_once_the_trainers_ended(tmp_path):
  """A parameter-server cluster's chief saves its backup from the variables its servers hold:
  a stop that signalled every task at once left a server that died of the signal under the
  chief's save (`Socket closed`; the launch ended 143, not 42: once in a suite on 2 cores)."""
  from tfdist.launch import processes
  from tfdist.launch.liveness import HEARTBEAT_ENV
  saved, beat = tmp_path / "saved", tmp_path / "trainer.heartbeat"
  beat.write_text('{"phase": "call"}')  # It began training: the grace period holds.
  trainer = ("import pathlib, signal, time\n"
             "def save(*_):\n"
             f"  time.sleep(1); pathlib.Path({str(saved)!r}).touch(); raise SystemExit(42)\n"
             "signal.signal(signal.SIGTERM, save)\nprint('up', flush=True)\ntime.sleep(60)\n")
  server = ("import os, pathlib, signal, time\n"  # Says whether the save was made when signalled.
            f"signal.signal(signal.SIGTERM, lambda *_: os._exit(pathlib.Path({str(saved)!r})"
            ".exists()))\nprint('up', flush=True)\ntime.sleep(60)\n")
  started = [_running(tmp_path, server, serves=True),
             _running(tmp_path, trainer, env=((HEARTBEAT_ENV, str(beat)),))]
  processes.stop(started, grace_period=30)
  assert [r.process.returncode for r in started] == [1, 42]  # Saved before the server's signal.


def test_a_stop_asked_by_a_signal_gives_the_grace_period_whatever_the_heartbeat_says(tmp_path):
  """A task whose heartbeat still says "starting" (or has none yet) saves in the grace period
  of a stop signal to the launcher: SIGKILLed at once, a preempted worker lost its save (a
  suite's run on 2 loaded cores: 143, not 42). A stop of the launcher's own (a failure, the
  start-up deadline) still kills such a cluster at once."""
  from tfdist.launch import processes
  saver = ("import signal, sys, time\n"
           "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1), sys.exit(42)))\n"
           "print('up', flush=True)\ntime.sleep(60)\n")
  asked, own = [_running(tmp_path, saver)], [_running(tmp_path, saver)]
  processes.stop(asked, grace_period=30, asked=True)
  processes.stop(own, grace_period=30)
  assert (asked[0].process.returncode, own[0].process.returncode) == (42, -signal.SIGKILL)


def test_the_root_cause_is_the_failed_task_whose_output_ended_first():
  """Two failed tasks seen at once (a loaded launcher looked late): the one that ended first
  is the cause, not the first in the plan's order. Before, a survivor's collective error
  (worker-0, a second after worker-2 died) was named the root cause and cost a restart."""
  from tfdist.launch import processes
  from tfdist.launch.plan import ProcessPlan

  def task(name, ended_at):
    plan = ProcessPlan(None, (name,), (), name, False, None)
    return processes.Running(plan, None, None, ended_at)
  survivor, lost, writing = task("worker-0", 12.5), task("worker-2", 11.0), task("worker-1", None)
  assert processes.first_to_end([survivor, writing, lost]) is lost
  assert processes.first_to_end([writing, survivor]) is survivor
  assert processes.first_to_end([]) is None
  # Ends within one look of the launcher's loop: the plan's order (worker-0 before worker-1).
  together = [task("worker-0", 11.1), task("worker-1", 11.0)]
  assert processes.first_to_end(together) is together[0]
