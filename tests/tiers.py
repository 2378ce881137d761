"""The default run and the extended one (`--extended`, `tests/conftest.py`): parameters of one
test of which one stays in the default run and the rest are its extended angles."""

import pytest


def all_but(kept, values, also: str) -> list:
  """`values` as a parametrize list, each but `kept` marked `extended(also=also)`.

  Args:
    kept: the value (a tuple for several names) the default run keeps.
    values: every value, in order.
    also: the test's own node id without parameters (the kept value checks the guarantee).

  Returns:
    `values`, the extended ones as `pytest.param`s.

  Example:

  ```python
  @pytest.mark.parametrize("strategy", all_but(
      "mirrored", ["default", "mirrored"], also="tests/test_x.py::test_fit_as_keras"))
  def test_fit_as_keras(strategy): ...
  ```
  """
  mark = pytest.mark.extended(also=also)
  return [value if value == kept else
          pytest.param(*(value if isinstance(value, tuple) else (value,)), marks=mark)
          for value in values]
