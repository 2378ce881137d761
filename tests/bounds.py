"""A test's own bound on what it waits for stays within pytest-timeout's limit on the test, so
the test's own message is the one seen (issue 58: bounds of 400 s and 420 s under 300 s never
fired). `conftest` sets the running test's limit and makes `subprocess` check each bound; tests'
own waits call `check`."""

import inspect
import subprocess

_limit: list[float] = []  # pytest-timeout's seconds for the running test; empty: none.


def check(seconds: float | None) -> None:
  """Raises AssertionError when a wait of `seconds` could outlast the running test's limit."""
  if seconds is not None and _limit and seconds > _limit[0]:
    raise AssertionError(
        f"a wait of {seconds:g} s is bounded past pytest-timeout's {_limit[0]:g} s for this "
        "test: its own message would never be seen (mark the test @pytest.mark.timeout(...) "
        "above its bounds)")


def running_test(limit: float | None) -> None:
  """The test about to run has pytest-timeout's `limit` (None: none, or no test running)."""
  _limit[:] = [limit] if limit else []


def _checked(method):
  signature = inspect.signature(method)

  def bounded(self, *args, **kwargs):
    check(signature.bind(self, *args, **kwargs).arguments.get("timeout"))
    return method(self, *args, **kwargs)
  bounded.__wrapped__ = method
  return bounded


if not hasattr(subprocess.Popen.communicate, "__wrapped__"):
  subprocess.Popen.communicate = _checked(subprocess.Popen.communicate)
  subprocess.Popen.wait = _checked(subprocess.Popen.wait)
