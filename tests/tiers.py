"""The default run and the extended one (`--extended`, `tests/conftest.py`): the parameters of
one test of which some stay in the default run and the rest are its extended angles."""

import pytest


def all_but(values, *kept) -> list:
  """`values` as a parametrize list, each not in `kept` marked `extended`: its guarantee is
  checked in the default run by the kept ones (the mark's `also` is the test itself).

  Args:
    values: every value, in order (a tuple for several argument names).
    *kept: the values the default run keeps.

  Returns:
    `values`, the extended ones as `pytest.param`s.

  Example:

  ```python
  @pytest.mark.parametrize("strategy", all_but(["default", "mirrored"], "mirrored"))
  def test_fit_as_keras(strategy): ...
  ```
  """
  return [value if value in kept else
          pytest.param(*(value if isinstance(value, tuple) else (value,)),
                       marks=pytest.mark.extended)
          for value in values]
