"""Tasks forked from the preloaded TensorFlow (`tfdist.machine.preload`), against the reference
they stand in for: the same program run by a fresh interpreter."""

import json
import os
import signal
import subprocess
import sys
import time
import types

import psutil
import pytest

from tests.conftest import CONFIGS, PROGRAMS, REPO
from tests.launching import ENV, running
from tfdist.launch.plan import SCRIPT_HOOK
from tfdist.machine import preload
from tfdist.testing import forked

FACTS = str(PROGRAMS / "interpreter_facts.py")


CLIENT = str(PROGRAMS / "preload_client.py")
SLEEPER = "import os, time\nprint('up', os.getppid(), flush=True)\ntime.sleep(60)\n"


@pytest.fixture(scope="module")
def shared():
  """The suite's shared server of this test process (tests/conftest.py), which every launch
  the tests start may use: its `path` and `pid`."""
  path = os.environ[preload.SHARED_ENV]
  pid = min(p.pid for p in psutil.process_iter(["cmdline"])  # Its forked tasks come after.
            if path in (p.info["cmdline"] or []) and "--at" in p.info["cmdline"])
  return types.SimpleNamespace(path=path, pid=pid)


@pytest.fixture(scope="module", params=["own", "shared"])
def server(request):
  """A launch's side: forking from a server of its own, or from a shared one."""
  s = _Asking(request.getfixturevalue("shared").path if request.param == "shared" else None)
  yield s
  assert s.client.shared == (request.param == "shared"), s.client.declined
  s.client.close()


class _Asking:
  """`preload.Preloaded` asked with the shared server's path in each task's environment (or
  none: its own server)."""

  def __init__(self, path):
    self.client, self._path = preload.Preloaded(), path

  def start(self, argv, env, cwd=None):
    env = {k: v for k, v in env.items() if k != preload.SHARED_ENV}
    return self.client.start(argv, {**env, **({preload.SHARED_ENV: self._path}
                                              if self._path else {})}, cwd=cwd)


def _base_env():
  return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}  # Per test.


def _env(tmp_path, **extra):
  del tmp_path
  return {**_base_env(), "PYTHONPATH": os.pathsep.join([SCRIPT_HOOK, str(REPO)]),
          "TF_CPP_MIN_LOG_LEVEL": "2", "TFDIST_CONFIG": str(CONFIGS / "default.yaml"),
          **extra}


def _fresh(argv, env, cwd):
  p = subprocess.run(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True,
                     text=True, timeout=120)
  return p.returncode, p.stdout + p.stderr


def _forked(server, argv, env, cwd):
  task = server.start(argv, env, cwd=cwd)
  assert task is not None, "the preloaded server refused a forkable program"
  code = task.wait(timeout=120)
  return code, task.stdout.read().decode()


def _facts(output):
  line = next(line for line in output.splitlines() if line.startswith("{"))
  return json.loads(line)


_FRESH = {}
"""{end: (code, output, left_open.txt)} of FACTS run by a fresh interpreter in its folder: one
reference for both servers' forks."""


@pytest.fixture(scope="module")
def facts_folder(tmp_path_factory):
  return tmp_path_factory.mktemp("facts")


@pytest.mark.parametrize("end,code", [("", 0), ("3", 3), ("raise", 1), ("message", 1)])
def test_a_forked_program_sees_and_ends_as_under_a_fresh_interpreter(server, facts_folder, end,
                                                                      code):
  folder = facts_folder / f"end{end}"  # The same folder (cwd, TMPDIR) for both runs.
  folder.mkdir(exist_ok=True)

  def ran(run):
    (folder / "left_open.txt").unlink(missing_ok=True)
    env = _env(folder, TFDIST_PREPARE="1", TMPDIR=str(folder))  # Not the server's.
    return run([sys.executable, FACTS, end], env, str(folder)) + (
        (folder / "left_open.txt").read_text(),)
  if end not in _FRESH:
    _FRESH[end] = ran(_fresh)
  (fresh_code, fresh_out, fresh_file), (forked_code, forked_out, forked_file) = \
      _FRESH[end], ran(lambda *a: _forked(server, *a))
  assert forked_code == fresh_code == code, (fresh_out, forked_out)
  fresh, forked = _facts(fresh_out), _facts(forked_out)
  assert fresh.pop("numpy_draw") != forked.pop("numpy_draw")
  assert forked == fresh and fresh["tempdir"] == str(folder)
  assert fresh["tfdist_after_tf"] and not fresh["tfdist_before_tf"]  # The hook, in both.
  assert forked_file == fresh_file == "written before the end"
  for line in ("thread joined\natexit ran", "ValueError: raised at the end",
               "ended with a message"):
    assert (line in forked_out) == (line in fresh_out), (line, fresh_out, forked_out)


def test_a_module_run_with_m_gets_its_arguments_as_under_a_fresh_interpreter(server, tmp_path):
  argv = [sys.executable, "-m", "json.tool", "--sort-keys", "in.json"]
  (tmp_path / "in.json").write_text('{"b": 1, "a": [2]}')
  fresh = _fresh(argv, _env(tmp_path), str(tmp_path))
  forked = _forked(server, argv, _env(tmp_path), str(tmp_path))
  assert forked == fresh and fresh[0] == 0 and '"a"' in fresh[1]


def test_two_forked_tasks_draw_different_numpy_numbers(server, tmp_path):
  draws = [_facts(_forked(server, [sys.executable, FACTS], _env(tmp_path), str(tmp_path))[1])
           ["numpy_draw"] for _ in range(2)]
  assert draws[0] != draws[1]


def test_the_suites_forked_run_gives_what_subprocess_run_gives_output_and_errors_apart(
    tmp_path):
  """`tfdist.testing.forked.run`, by which the tests run their programs, forks them from the
  suite's shared server and returns what `subprocess.run(capture_output=True, text=True)` of a
  fresh interpreter returns: the exit code, the output, the errors, each on its own."""
  argv, env = [sys.executable, FACTS, "raise"], _env(tmp_path)
  with open(tmp_path / "popen.log", "wb") as log:
    task = forked.popen(argv, env, stdout=log.fileno(), cwd=tmp_path)
  assert isinstance(task, preload.ForkedTask)  # Forked, not started as a process.
  assert task.wait(timeout=120) == 1
  fresh = subprocess.run(argv, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL,
                         capture_output=True, text=True, timeout=120)
  done = forked.run(argv, env=env, cwd=tmp_path, timeout=120)
  assert done.returncode == fresh.returncode == 1, (fresh.stderr, done.stderr)
  for result in (fresh, done):
    result.facts = _facts(result.stdout)
    result.facts.pop("numpy_draw")
  assert done.facts == fresh.facts
  assert done.stdout.split("\n", 1)[1] == fresh.stdout.split("\n", 1)[1] == \
      "thread joined\natexit ran\n"
  assert done.stderr.splitlines()[-1] == fresh.stderr.splitlines()[-1] == \
      "ValueError: raised at the end"


def test_a_signal_ends_a_forked_task_as_it_ends_a_process(server, tmp_path):
  program = tmp_path / "sleeps.py"
  program.write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
  task = server.start([sys.executable, str(program)], _env(tmp_path))
  assert task.stdout.readline() == b"up\n"
  os.killpg(task.pid, signal.SIGTERM)  # As `launch.processes.stop` does: the task's group.
  reference = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  reference.send_signal(signal.SIGTERM)
  assert task.wait(timeout=30) == reference.wait(timeout=30) == -signal.SIGTERM


def _gone(pid, within=10):
  """Whether process `pid` is gone (or a zombie) within `within` seconds."""
  deadline = time.monotonic() + within
  while time.monotonic() < deadline and running(pid):
    time.sleep(0.1)
  return not running(pid)


def test_a_shared_servers_path_appears_only_once_it_listens(tmp_path, monkeypatch):
  """`Shared` waits for the path only, and a launch that sees it connects at once: bound at
  the path before it listened, a launch between the two was refused and started a server of
  its own (seen once in a suite, in the test below)."""
  import socket
  path, seen = str(tmp_path / "s.sock"), []

  class Watched(socket.socket):
    def listen(self, *args):
      seen.append(os.path.exists(path))
      super().listen(*args)
  monkeypatch.setattr(preload.socket, "socket", Watched)
  listener = preload.listening_at(path)
  try:
    assert seen == [False], "the path was there before the socket listened"
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as client:
      client.connect(path)
  finally:
    listener.close()


@pytest.mark.parametrize("kind", ["own", "shared"])
def test_a_server_killed_takes_its_tasks_with_it(tmp_path, kind):
  program = tmp_path / "sleeps.py"
  program.write_text(SLEEPER)
  s = preload.Shared(str(tmp_path / "preload.sock"), env=_env(tmp_path)) \
      if kind == "shared" else None
  asking = _Asking(s.path if s else None)
  task = asking.start([sys.executable, str(program)], _env(tmp_path))
  assert task.stdout.readline().startswith(b"up") and asking.client.shared == bool(s)
  os.kill((s or asking.client._server).pid, signal.SIGKILL)  # noqa: SLF001  As an OOM kill.
  assert task.wait(timeout=30) == -signal.SIGKILL
  assert _gone(task.pid)
  asking.client.close()
  if s:
    s.close()


def test_a_launch_killed_9_takes_its_shared_servers_tasks_not_anothers(shared, tmp_path):
  (tmp_path / "sleeps.py").write_text(SLEEPER)
  env = {**_env(tmp_path), preload.SHARED_ENV: shared.path}
  launches = [subprocess.Popen([sys.executable, CLIENT, str(tmp_path / "sleeps.py")], env=env,
                               stdout=subprocess.PIPE, text=True) for _ in range(2)]
  started = [json.loads(launch.stdout.readline()) for launch in launches]
  ups = [launch.stdout.readline().split() for launch in launches]
  assert all(s["shared"] for s in started) and ups == [["up", str(shared.pid)]] * 2, (started,
                                                                                     ups)
  launches[0].kill()  # As a host's launcher killed -9: its connection closes with it.
  launches[0].wait()
  assert _gone(started[0]["task"]), "a killed launch's task outlived it"
  assert launches[1].poll() is None and not _gone(started[1]["task"], within=1)
  os.kill(started[1]["task"], signal.SIGTERM)
  assert launches[1].wait(timeout=30) == 0 and not _gone(shared.pid, within=0)


@pytest.mark.parametrize("differs,declined", [
    ("environment", "TF_ENABLE_ONEDNN_OPTS"), ("resource limit", "its limits"),
    ("a switch of the server's per_task", None)])
def test_a_launch_the_shared_server_could_not_stand_for_forks_from_its_own(shared, tmp_path,
                                                                           differs, declined):
  """A shared server's task would inherit the server's limits, namespaces and environment, not
  its launch's: such a launch starts its own server (the task's parent is not the shared one).
  A variable the server was told its tasks may have of their own does not count."""
  import resource
  (tmp_path / "sleeps.py").write_text(SLEEPER.replace("60", "0"))
  env = {**_env(tmp_path), preload.SHARED_ENV: shared.path}
  limit = resource.getrlimit(resource.RLIMIT_NOFILE)
  if differs == "environment":
    env["TF_ENABLE_ONEDNN_OPTS"] = "0"  # Read by TensorFlow's import.
  elif differs.startswith("a switch"):
    env["HANG_AT"] = "3:1"  # tests/programs' own: the suite's server has it in `per_task`.
  launch = subprocess.run(
      [sys.executable, CLIENT, str(tmp_path / "sleeps.py")], env=env, capture_output=True,
      text=True, timeout=120, preexec_fn=None if differs != "resource limit" else
      lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit[0] - 1, limit[1])))
  assert launch.returncode == 0, launch.stderr
  started, up = launch.stdout.splitlines()[:2]
  started = json.loads(started)
  assert started["shared"] == (declined is None) and up.split()[0] == "up", launch.stdout
  assert started["declined"] == declined, started
  assert (up.split()[1] == str(shared.pid)) == (declined is None)


def test_the_suites_shared_server_lets_every_switch_tests_programs_read_differ():
  """Each variable tests/programs read is one TensorFlow's import does not: the suite's server
  lets it differ between launches (else a launch given it imports TensorFlow on its own)."""
  import re
  from tests.conftest import PROGRAM_SWITCHES
  read = set()
  for path in PROGRAMS.glob("*.py"):
    read |= set(re.findall(r'(?:environ(?:\.get)?[\[(]|getenv\()"([A-Z_0-9]+)"',
                           path.read_text()))
  at_import = {"TF_CPU_ALLOCATOR_USE_BFC"}  # TensorFlow's: a launch given it forks elsewhere.
  assert read - set(preload.PER_TASK) - at_import == set(PROGRAM_SWITCHES)


@pytest.mark.parametrize("argv", [
    ["bash", "-c", "true"], [sys.executable, "-c", "print(1)"],
    [sys.executable, "-X", "dev", "train.py"], [sys.executable], [sys.executable, "-m"]])
def test_what_is_not_a_python_program_of_this_interpreter_is_not_forked(argv):
  assert not preload.forkable(argv, os.environ)


def test_python_programs_of_this_interpreter_are_forkable():
  for argv in ([sys.executable, "train.py", "--x"], [sys.executable, "-u", "train.py"],
               [sys.executable, "-m", "tfdist", "cluster-server"]):
    assert preload.forkable(argv, os.environ), argv


def test_an_environment_differing_in_more_than_the_per_task_variables_is_not_forked():
  preloaded = {"PATH": "/bin", "TF_ENABLE_ONEDNN_OPTS": "1"}
  assert preload.same_but_per_task({**preloaded, "TF_CONFIG": "{}", "TFDIST_X": "1",
                                    "CUDA_VISIBLE_DEVICES": "0", "PYTHONPATH": "a"}, preloaded)
  assert not preload.same_but_per_task({**preloaded, "TF_ENABLE_ONEDNN_OPTS": "0"}, preloaded)
  assert not preload.same_but_per_task({"PATH": "/bin"}, preloaded)


@pytest.mark.parametrize("flags,parent,shared_at", [
    ((), "preload.py --at", True), ((), "preload.py", False),
    (("--preload", "on"), "preload.py --at", True), (("--preload", "off"), "tfdist", True)])
def test_launch_forks_python_tasks_from_the_preloaded_server_unless_told_not_to(
    tmp_path, shared, flags, parent, shared_at):
  program = tmp_path / "parent.py"
  program.write_text("import os\nprint('parent:', open(f'/proc/{os.getppid()}/cmdline')"
                     ".read().replace(chr(0), ' '))\n")
  env = {k: v for k, v in ENV.items() if k not in (preload.SHARED_ENV, "PYTEST_CURRENT_TEST")}
  result = subprocess.run(
      [sys.executable, "-m", "tfdist", "launch", str(CONFIGS / "default.yaml"), "--logs",
       str(tmp_path / "logs"), *flags, "--", sys.executable, str(program)],
      cwd=REPO, env={**env, **({preload.SHARED_ENV: shared.path} if shared_at else {})},
      capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  line = next(line for line in result.stdout.splitlines() if "parent:" in line)
  assert parent in line.split("parent:")[1] and ("--at" in line) == ("--at" in parent), \
      (line, result.stderr)


@pytest.mark.parametrize("flags,said", [(("--preload", "on"), True), ((), False)])
def test_a_command_that_cannot_be_forked_starts_as_a_process_said_once_when_asked(
    tmp_path, flags, said):
  result = subprocess.run(
      [sys.executable, "-m", "tfdist", "launch", str(CONFIGS / "multi_worker_mirrored.yaml"),
       "--logs", str(tmp_path / "logs"), *flags, "--verbose", "--", sys.executable, "-c",
       "import os; print('parent:', open(f'/proc/{os.getppid()}/cmdline').read()"
       ".replace(chr(0), ' '))"],
      cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  parents = [line for line in result.stdout.splitlines()
             if line.startswith("[worker-") and "parent:" in line]
  assert len(parents) == 2 and all("tfdist" in p and "preload.py" not in p for p in parents)
  line = "tfdist launch: --preload on: worker-0 starts as its own process: its command is not"
  assert result.stderr.count(line) == (1 if said else 0), result.stderr
