"""The suite's own rules, each able to fail: a test's bounds stay within pytest-timeout's limit
(`tests.bounds`), and every flag reaches a test through the CLI (`tests.flag_coverage`)."""

import os
import subprocess
import sys

import pytest

from tests import bounds, flag_coverage
from tests.conftest import REPO


@pytest.mark.timeout(30)
def test_a_wait_bounded_past_the_tests_timeout_fails_at_once_naming_it():
  with pytest.raises(AssertionError, match=r"^a wait of 60 s is bounded past pytest-timeout's "
                                           r"30 s for this test"):
    subprocess.run([sys.executable, "-c", "pass"], timeout=60)
  process = subprocess.Popen([sys.executable, "-c", "pass"])
  with pytest.raises(AssertionError, match="a wait of 45 s"):
    process.wait(45)
  assert process.wait(20) == 0
  assert subprocess.run([sys.executable, "-c", "pass"], timeout=29).returncode == 0
  with pytest.raises(AssertionError, match="a wait of 31 s"):
    bounds.check(31)


def test_a_flag_no_test_gives_through_the_cli_is_named():
  from tfdist.cli.main import COMMAND_FLAGS
  every = [f"{command} {' '.join(names)}" for command, names in COMMAND_FLAGS.items()]
  assert flag_coverage.unexercised(every) == []
  launch = next(i for i, line in enumerate(every) if line.startswith("launch "))
  every[launch] = every[launch].replace(" slurm", "")
  every.append("export slurm")  # Given to another command: not launch's.
  assert flag_coverage.unexercised(every) == ["tfdist launch --slurm"]


_GPU_LIST = """
import importlib.util, os, subprocess, sys
import tests.conftest as first
spec = importlib.util.spec_from_file_location("conftest", "tests/conftest.py")
second = importlib.util.module_from_spec(spec)
spec.loader.exec_module(second)  # As `from tests.conftest import` beside pytest's own import.
worker = subprocess.run([sys.executable, "-c", "import tests.conftest as c; print(c.GPUS)"],
                        capture_output=True, text=True, timeout=60).stdout.strip()
print(first.GPUS, second.GPUS, worker, repr(os.environ["CUDA_VISIBLE_DEVICES"]))
"""


def test_the_machines_gpus_reach_xdist_workers_and_a_second_import_while_hidden():
  """The suite hides GPUs from itself (CUDA_VISIBLE_DEVICES=""), yet `pytest -m gpu` must see
  the machine's: in a worker started after the hiding (as pytest-xdist's are) and in a second
  import of conftest. An H200's `pytest -m gpu` skipped all (workers) or failed (a second
  import gave the launches no GPU) before."""
  env = {k: v for k, v in os.environ.items() if k != "TFDIST_SUITE_GPUS"}
  env.update(CUDA_VISIBLE_DEVICES="2,3", PYTHONPATH=str(REPO))
  done = subprocess.run([sys.executable, "-c", _GPU_LIST], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=120)
  assert done.stdout.strip() == "['2', '3'] ['2', '3'] ['2', '3'] ''", done.stderr[-2000:]


def test_the_slowest_first_files_are_the_suites_and_the_slowest_come_first(request):
  """`conftest.SLOWEST_FIRST` names files that exist (a renamed one would drop back into the
  collected order unnoticed), and the session's items start with them, in that order."""
  from tests.conftest import SLOWEST_FIRST
  assert [name for name in SLOWEST_FIRST if not (REPO / "tests" / name).is_file()] == []
  files = list(dict.fromkeys(item.path.name for item in request.session.items))
  selected = [name for name in SLOWEST_FIRST if name in files]
  assert files[:len(selected)] == selected


def test_the_readme_run_collects_every_test_of_every_file_and_deselects_none():
  """The README's command (and so CI) runs every test: its collection equals that of every
  test file named one by one, from each file, with nothing deselected (a second tier, a
  default `-m`, or a file pytest's patterns miss would each fail this)."""
  def collected(*paths):
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0",
                           "-p", "no:cacheprovider", *paths], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTEST_ADDOPTS": ""})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "deselected" not in done.stdout.splitlines()[-1], done.stdout[-500:]
    return sorted(line for line in done.stdout.splitlines() if "::" in line)
  files = sorted(f"tests/{path.name}" for path in (REPO / "tests").glob("test_*.py"))
  default = collected()
  assert default == collected(*files)
  assert sorted({test.split("::")[0] for test in default}) == files
