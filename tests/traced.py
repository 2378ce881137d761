"""What TensorFlow traced, seen through its own op callbacks: the collective ops put into
functions while a block runs, by op type and input dtype, with the elements they take in. A
test reads what ran from TensorFlow, not from tfdist's own words."""

import contextlib

import numpy as np


@contextlib.contextmanager
def collectives():
  """Yields {(op type, input dtype): elements}, filled while the block traces functions, and
  {("largest", op type): the most elements one op of the type takes in}."""
  from tensorflow.python.framework import op_callbacks
  found: dict = {}

  def seen(op_type, inputs, attrs, outputs, op_name=None, graph=None):
    del attrs, op_name
    if graph is not None and op_type.startswith("Collective") and inputs:
      tensor = inputs[0]
      key = (op_type, tensor.dtype.name)
      elements = int(np.prod(tensor.shape)) if tensor.shape.is_fully_defined() else 0
      found[key] = found.get(key, 0) + elements
      found["largest", op_type] = max(found.get(("largest", op_type), 0), elements)
    return outputs
  op_callbacks.add_op_callback(seen)
  try:
    yield found
  finally:
    op_callbacks.remove_op_callback(seen)


def by_type(found: dict) -> dict:
  """{op type: elements}, the dtypes summed."""
  totals: dict = {}
  for (op_type, dtype), elements in found.items():
    if op_type != "largest":
      totals[op_type] = totals.get(op_type, 0) + elements
  return totals


def largest(found: dict) -> dict:
  """{op type: the most elements one op of the type takes in}."""
  return {op_type: elements for (first, op_type), elements in found.items()
          if first == "largest"}
