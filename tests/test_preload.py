"""Tasks forked from the preloaded TensorFlow (`tfdist.machine.preload`), against the reference
they stand in for: the same program run by a fresh interpreter."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import CONFIGS, PROGRAMS, REPO
from tests.launching import ENV
from tfdist.launch.plan import SCRIPT_HOOK
from tfdist.machine import preload

FACTS = str(PROGRAMS / "interpreter_facts.py")


@pytest.fixture(scope="module")
def server():
  s = preload.Preloaded()
  yield s
  s.close()


def _env(tmp_path, **extra):
  del tmp_path
  environ = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}  # Per test.
  return {**environ, "PYTHONPATH": os.pathsep.join([SCRIPT_HOOK, str(REPO)]),
          "TF_CPP_MIN_LOG_LEVEL": "2", "TFDIST_CONFIG": str(CONFIGS / "default.yaml"),
          "FACT_TASK": "one", **extra}


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


@pytest.mark.parametrize("end,code", [("", 0), ("3", 3), ("raise", 1), ("message", 1)])
def test_a_forked_program_sees_and_ends_as_under_a_fresh_interpreter(server, tmp_path, end,
                                                                      code):
  results = {}
  for how, run in (("fresh", _fresh), ("forked", lambda *a: _forked(server, *a))):
    (tmp_path / "left_open.txt").unlink(missing_ok=True)
    env = _env(tmp_path, TFDIST_PREPARE="1")
    results[how] = run([sys.executable, FACTS, end], env, str(tmp_path))
    results[how] += ((tmp_path / "left_open.txt").read_text(),)
  (fresh_code, fresh_out, fresh_file), (forked_code, forked_out, forked_file) = \
      results["fresh"], results["forked"]
  assert forked_code == fresh_code == code, (fresh_out, forked_out)
  fresh, forked = _facts(fresh_out), _facts(forked_out)
  assert fresh.pop("numpy_draw") != forked.pop("numpy_draw")
  assert forked == fresh
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


def test_a_signal_ends_a_forked_task_as_it_ends_a_process(server, tmp_path):
  program = tmp_path / "sleeps.py"
  program.write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
  task = server.start([sys.executable, str(program)], _env(tmp_path))
  assert task.stdout.readline() == b"up\n"
  os.killpg(task.pid, signal.SIGTERM)  # As `launch.processes.stop` does: the task's group.
  reference = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  reference.send_signal(signal.SIGTERM)
  assert task.wait(timeout=30) == reference.wait(timeout=30) == -signal.SIGTERM


def test_a_server_killed_takes_its_tasks_with_it(tmp_path):
  s = preload.Preloaded()
  program = tmp_path / "sleeps.py"
  program.write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
  task = s.start([sys.executable, str(program)], _env(tmp_path))
  assert task.stdout.readline() == b"up\n"
  os.kill(s._server.pid, signal.SIGKILL)  # noqa: SLF001  As an OOM kill would.
  assert task.wait(timeout=30) == -signal.SIGKILL
  deadline = time.monotonic() + 10
  while time.monotonic() < deadline and os.path.exists(f"/proc/{task.pid}"):
    time.sleep(0.1)
  status = open(f"/proc/{task.pid}/status").read() if os.path.exists(
      f"/proc/{task.pid}") else "gone"
  assert status == "gone" or "zombie" in status
  s.close()


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


@pytest.mark.parametrize("flags,parent", [
    ((), "preload.py"), (("--preload", "on"), "preload.py"), (("--preload", "off"), "tfdist")])
def test_launch_forks_python_tasks_from_the_preloaded_server_unless_told_not_to(tmp_path, flags,
                                                                                parent):
  program = tmp_path / "parent.py"
  program.write_text("import os\nprint('parent:', open(f'/proc/{os.getppid()}/cmdline')"
                     ".read().replace(chr(0), ' '))\n")
  result = subprocess.run(
      [sys.executable, "-m", "tfdist", "launch", str(CONFIGS / "default.yaml"), "--logs",
       str(tmp_path / "logs"), *flags, "--", sys.executable, str(program)],
      cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  line = next(line for line in result.stdout.splitlines() if "parent:" in line)
  assert parent in line.split("parent:")[1], line


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
