"""The suite's own rules, each able to fail: a test's bounds stay within pytest-timeout's limit
(`tests.bounds`), and every flag reaches a test through the CLI (`tests.flag_coverage`)."""

import subprocess
import sys

import pytest

from tests import bounds, flag_coverage


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
