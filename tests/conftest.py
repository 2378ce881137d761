import ctypes
import os
import pathlib
import signal

import psutil
import pytest

from tfdist.machine import facts

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The suite runs on CPU devices on every machine (logical CPUs, local clusters of several
# processes): this process and its children see no GPU. Tests marked `gpu` run where a GPU is,
# giving `GPUS` back to the processes they start (`gpu_env`).
GPUS = facts.visible_gpus()
os.environ["CUDA_VISIBLE_DEVICES"] = ""


def gpu_env() -> dict:
  """The environment that gives a started process this machine's GPUs."""
  return {"CUDA_VISIBLE_DEVICES": ",".join(GPUS)}


def pytest_configure(config):
  config.addinivalue_line("markers", "gpu: needs a GPU (run with -m gpu); skipped without one")


_PR_SET_CHILD_SUBREAPER = 36
_EXIT_GRACE_S = 5  # For a task that dies with its launcher (a parent-death signal) to go.


def pytest_sessionstart(session):
  """Makes this process its descendants' reaper: a process a test started whose parent died
  (a launcher killed before its tasks) is re-parented here, not to init, so the checks below
  still find it."""
  ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
  """Kills, by process group, every process a test's body started that outlives it, whatever
  the outcome; a test that passed but left one fails, naming it."""
  before = {p.pid for p in _alive_descendants()}
  try:
    result = yield
  except BaseException:
    _kill(_outliving(before))
    raise
  left = _outliving(before)
  _kill(left)
  assert not left, "the test left processes alive (killed now):\n" + _describe(left)
  return result


def pytest_sessionfinish(session, exitstatus):
  """Fails the run when a process the suite started (a fixture's, say) is still alive."""
  left = _alive_descendants()
  if not left:
    return
  reporter = session.config.pluginmanager.get_plugin("terminalreporter")
  reporter.ensure_newline()
  reporter.write_sep("=", f"{len(left)} process(es) the suite started outlived it (killed now)",
                     red=True)
  reporter.write_line(_describe(left))
  _kill(left)
  session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _alive_descendants() -> list[psutil.Process]:
  def alive(process):
    try:
      return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
      return False
  return [p for p in psutil.Process().children(recursive=True) if alive(p)]


def _outliving(before: set[int]) -> list[psutil.Process]:
  """The processes started since `before` still alive after a short grace to exit."""
  new = [p for p in _alive_descendants() if p.pid not in before]
  _, alive = psutil.wait_procs(new, timeout=_EXIT_GRACE_S) if new else ([], [])
  return [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _describe(processes) -> str:
  lines = []
  for process in processes:
    try:
      lines.append(f"  pid {process.pid}: {' '.join(process.cmdline())[:200]}")
    except psutil.NoSuchProcess:
      pass
  return "\n".join(lines)


def _kill(processes) -> None:
  """SIGKILLs each process's group (its own, never this one's), else the process."""
  for process in processes:
    try:
      group = os.getpgid(process.pid)
      if group != os.getpgrp():
        os.killpg(group, signal.SIGKILL)
      else:
        process.kill()
    except (ProcessLookupError, psutil.NoSuchProcess):
      pass


def pytest_collection_modifyitems(config, items):
  if GPUS:
    return
  skip = pytest.mark.skip(reason="no GPU on this machine")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip)

REPO = pathlib.Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"
PROGRAMS = REPO / "tests" / "programs"


@pytest.fixture(scope="session")
def two_cpus():
  """Splits this test process's CPU into 2 logical devices (once: TensorFlow allows no change)."""
  import tfdist
  from tfdist.config import DevicesConfig
  tfdist.configure_devices(DevicesConfig(logical_cpus=2))


@pytest.fixture
def write_config(tmp_path):
  def write(text: str, name: str = "config.yaml") -> pathlib.Path:
    path = tmp_path / name
    path.write_text(text)
    return path
  return write
