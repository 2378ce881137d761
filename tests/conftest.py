import contextlib
import os
import pathlib
import signal

import psutil
import pytest

from tests import bounds, flag_coverage, slurm_run
from tfdist.machine import facts

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The suite runs on CPU devices on every machine (logical CPUs, local clusters of several
# processes): this process and its children see no GPU. Tests marked `gpu` run where a GPU is,
# giving `GPUS` back to the processes they start (`gpu_env`). The machine's list is read once,
# before it is hidden, and handed on in the environment: pytest-xdist's workers inherit the
# hidden one, and `from tests.conftest import` may import this file a second time (both hid
# the H200 from `pytest -m gpu` on 2026-11-27).
_GPUS = "TFDIST_SUITE_GPUS"
os.environ.setdefault(_GPUS, ",".join(facts.visible_gpus()))
GPUS = [name for name in os.environ[_GPUS].split(",") if name]
os.environ["CUDA_VISIBLE_DEVICES"] = ""
# Loopback only, for Ray's head, the launchers and these processes (read when Ray is imported):
# Ray otherwise binds every interface and names the node by its outward address. Set here, with
# the suite's other variables, before the shared preloaded server starts with them; so is
# RAY_CLIENT_MODE, which `import ray` sets to 0 when test_ray.py is collected (every launch after
# differed from the server's environment in it, and started a server of its own).
RAY_LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
os.environ.update(RAY_LOOPBACK, RAY_CLIENT_MODE="0")


def gpu_env() -> dict:
  """The environment that gives a started process this machine's GPUs."""
  return {"CUDA_VISIBLE_DEVICES": ",".join(GPUS)}


def pytest_configure(config):
  config.addinivalue_line("markers", "gpu: needs a GPU (run with -m gpu); skipped without one")
  if not hasattr(config, "workerinput"):  # The controller: pytest-xdist's workers inherit it.
    flag_coverage.start()
  if _runs_tests(config):
    _start_shared_preload()


def _runs_tests(config) -> bool:
  """Whether this process runs tests: a pytest-xdist worker, or the one process without it."""
  return hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None)


# One preloaded TensorFlow per test process for every `tfdist launch` the tests start
# (`preload.Shared`): each launch forks its tasks from it instead of importing TensorFlow in a
# server of its own (4-5 CPU-s a launch, 2026-11-28). A launch that may not use it (another
# environment, a network namespace, a resource limit) starts its own, as users' launches do;
# tests/test_preload.py runs both kinds.
_SHARED = []
PROGRAM_SWITCHES = (
    "CHIEF_DELAY", "CHIEF_END_S", "CONFIG", "COORDINATOR_LOG", "CSV_LOG", "DIE", "GONE",
    "GONE_AT", "GO_FILE",
    "HANG_AT", "HANG_IN", "HANG_MARKER", "KILL_AT", "LATE_STACKS", "LOOP", "MARKER", "MIDWAY",
    "ONCE", "OWN_STEP", "PAUSE", "PAUSE_AFTER_EPOCH", "PAUSE_AT", "PHASE_AUDIT", "RAISE_AT",
    "SLOW_EPOCH_END", "STAGE", "STEPS", "STEPS_PER_EXECUTION", "STEP_LINES", "TRAIN_STEP")
"""What tests/programs read of their environment after importing TensorFlow: a test's
switches, which may differ between launches of one shared server (`preload.Shared`'s
`per_task`; test_preload checks the list against the programs)."""


def _start_shared_preload() -> None:
  import tempfile
  from tfdist.machine import preload
  path = os.path.join(tempfile.gettempdir(), f"tfdist-preload-{os.getpid()}.sock")
  with contextlib.suppress(FileNotFoundError):
    os.unlink(path)  # A server of a process this pid once was, killed -9.
  _SHARED.append(preload.Shared(path, per_task=PROGRAM_SWITCHES))
  os.environ[preload.SHARED_ENV] = path


def _stop_shared_preload() -> None:
  while _SHARED:
    _SHARED.pop().close()


# Every process the suite starts inherits this mark (tests pass os.environ on), so the checks
# below find it even after its parent died (a task whose launcher was killed is re-parented).
_MARK, _SESSION = "TFDIST_TEST_SESSION", str(os.getpid())
os.environ[_MARK] = _SESSION
_EXIT_GRACE_S = 5  # For a task that dies with its launcher (a parent-death signal) to go.
_BACKGROUND = []  # The real-Slurm runs this process started early.


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
  """Kills, by process group, every process a test's body started that outlives it, whatever
  the outcome; a test that passed but left one fails, naming it."""
  before = {p.pid for p in _started_by_suite()}
  marker = item.get_closest_marker("timeout")
  bounds.running_test(float(marker.args[0]) if marker and marker.args else
                      float(item.config.getini("timeout") or 0))
  try:
    result = yield
  except BaseException:
    _kill(_outliving(before))
    raise
  finally:
    bounds.running_test(None)
  left = _outliving(before)
  _kill(left)
  assert not left, "the test left processes alive (killed now):\n" + _describe(left)
  return result


def pytest_collection_finish(session):
  """Starts the real-Slurm script at once when its test is selected (one test process): its
  jobs wait on Slurm most of their minutes, so they run beside the other tests."""
  if hasattr(session.config, "workerinput"):
    return  # A pytest-xdist worker: the controller starts it (below).
  if any(item.nodeid == slurm_run.TEST_ID for item in session.items):
    _start_real_slurm(session.config, str(os.getpid()))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
  """Under pytest-xdist the controller starts it once a worker has collected: a worker would
  reach it last (pytest-xdist hands out files by their number of tests, most first)."""
  if slurm_run.TEST_ID in ids:
    _start_real_slurm(node.config, node.workerinput["testrunuid"])


def _start_real_slurm(config, run: str) -> None:
  if run not in _BACKGROUND and slurm_run.runs_here() and not config.option.collectonly:
    _BACKGROUND.append(run)
    slurm_run.start(run)


def pytest_sessionfinish(session, exitstatus):
  """Fails the run when a process the suite started (a fixture's, say) is still alive."""
  _stop_shared_preload()
  for run in _BACKGROUND:
    slurm_run.stop(run)
  if not hasattr(session.config, "workerinput"):
    unseen = flag_coverage.finish()
    if unseen and flag_coverage.whole_suite(session.config):  # Shown after failures too.
      reporter = session.config.pluginmanager.get_plugin("terminalreporter")
      reporter.write_sep("=", f"{len(unseen)} flag(s) no test gave through the CLI", red=True)
      reporter.write_line("  " + ", ".join(unseen))
      session.exitstatus = pytest.ExitCode.TESTS_FAILED
  left = _started_by_suite()
  if not left:
    return
  reporter = session.config.pluginmanager.get_plugin("terminalreporter")
  reporter.ensure_newline()
  reporter.write_sep("=", f"{len(left)} process(es) the suite started outlived it (killed now)",
                     red=True)
  reporter.write_line(_describe(left))
  _kill(left)
  session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _started_by_suite() -> list[psutil.Process]:
  """The live processes (not zombies) carrying this session's mark, this one excepted."""
  found = []
  for process in psutil.process_iter():
    try:
      if process.pid != os.getpid() and process.status() != psutil.STATUS_ZOMBIE and \
          process.environ().get(_MARK) == _SESSION:
        found.append(process)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
      pass
  return found


def _outliving(before: set[int]) -> list[psutil.Process]:
  """The processes started since `before` still alive after a short grace to exit."""
  new = [p for p in _started_by_suite() if p.pid not in before]
  if new:
    psutil.wait_procs(new, timeout=_EXIT_GRACE_S)
  return [p for p in _started_by_suite() if p.pid not in before]


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


# The files that take longest, slowest first (their tests' seconds in a fresh clone's run on 2
# vCPUs, three test processes, 2026-11-28: test_ray 277 ... test_cli 31): pytest-xdist hands
# files out in the order collected (`--no-loadscope-reorder`), so the slow ones start first and
# the processes end together. By its default order (most tests first) the slow files of few
# tests came last: one process ran 210 s after the other. The files that mostly wait (hang and
# start-up deadlines: test_hangs, test_launch_robustness) apart: run side by side (beside the
# data service's), they left the CPUs 40% idle for 90 s (vmstat; CPU per test, 2026-11-29).
SLOWEST_FIRST = (
    "test_ray.py", "test_hang_paths.py", "test_keras_arguments.py", "test_preload.py",
    "test_sharded_optimizer.py", "test_fit.py", "test_keras_contract.py", "test_launch.py",
    "test_data_service.py", "test_hangs.py", "test_step_memory.py", "test_training_paths.py",
    "test_custom_loop.py", "test_launch_robustness.py", "test_parallel.py", "test_serving.py",
    "test_elastic.py", "test_generation.py", "test_monitoring.py", "test_parameter_server.py",
    "test_user_script.py", "test_per_host.py", "test_fault_tolerance.py", "test_env.py",
    "test_docs.py", "test_export.py", "test_determinism.py", "test_cli.py")


def pytest_collection_modifyitems(config, items):
  # The slowest files first (above), the rest as collected; the real-Slurm test last: it waits
  # for the script the session started at collection, so in one test process the other tests
  # run while it works.
  rank = {name: index for index, name in enumerate(SLOWEST_FIRST)}
  items.sort(key=lambda item: (item.nodeid == slurm_run.TEST_ID,
                               rank.get(item.path.name, len(rank))))
  if GPUS:
    return
  skip = pytest.mark.skip(reason="no GPU on this machine")
  for item in items:
    if "gpu" in item.keywords:
      item.add_marker(skip)


REPO = pathlib.Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"
PROGRAMS = REPO / "tests" / "programs"


@pytest.fixture(autouse=True)
def _checkpoint_save_restored():
  """tfdist points a non-chief task's own `tf.train.Checkpoint.save` aside for the whole process
  (`user_files.checkpoints_on_chief_only`: a launched task is one process); a test running a
  non-chief config in this process would leave it pointed aside for the tests after it (seen:
  an asynchronous-checkpoint test's restore looked in an evaluator's scratch folder)."""
  import tensorflow as tf
  own = tf.train.Checkpoint.save
  yield
  tf.train.Checkpoint.save = own


@pytest.fixture(autouse=True)
def _unseeded_keras():
  """Each test starts as a fresh script does, Keras's global seed unset: a config's
  `training.seed` gives way to a seed the script set itself (`settings.seed`), and a seed an
  earlier test set in this process is no script's."""
  from keras.src.utils import rng_utils
  from keras.src.backend.common import global_state
  global_state.set_global_attribute(rng_utils.GLOBAL_RANDOM_SEED, None)
  yield


@pytest.fixture(autouse=True)
def _devices_first(request):
  """Every test process splits its CPU into 2 logical devices before its first test, whichever
  files pytest-xdist gives it first (TensorFlow takes the split only before it starts)."""
  request.getfixturevalue("two_cpus")


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


def pytest_unconfigure(config):
  del config
  _stop_shared_preload()  # Where the session never finished (a usage error).
