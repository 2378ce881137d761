"""What one training step of a Keras model holds besides its variables, read from the step's own
graph: the step (the model's forward pass, its compiled loss, `tape.gradient`) is traced for a
batch, not run, and every tensor of the forward pass that an op of the backward pass reads is
kept until then. That counts what a layer's output alone misses: a recurrent layer's per-step
values (its loop's accumulators, times its steps), attention's scores, the layers of nested
models, the loss's logits and softmax.

```python
kept = step_tensors(model, batch=32)
kept.kept, kept.by_unit["lstm"]
```
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import re

import numpy as np

_NOT_KEPT = {"ReadVariableOp", "Const", "VarHandleOp", "ResourceGather"}
# ResourceGather's rows are the embedding's: its gradient reads the indices, not the rows.
_GRADIENT_SCOPE = "gradient_tape/"


@dataclasses.dataclass(frozen=True)
class StepTensors:
  """Bytes of one training step's tensors.

  Attributes:
    kept: the forward tensors the backward pass reads, kept from the forward pass until then.
    by_unit: `kept` by the unit (`placement.units`) whose ops made each tensor; the loss's and
      the inputs' under "(loss and inputs)".
    working: on top of what is kept and the gradients, the most the step's other tensors hold
      at once (its ops run one at a time, in the order they were made or newest ready first,
      whichever holds more; each buffer freed after its last reader), or the optimizer's update of the largest variable (`UPDATE_COPIES` of
      it, and a sparse gradient's slices once more), whichever is more.
    gradients: the gradients the step returns (an embedding's: its rows' slices).
  """
  kept: int
  by_unit: dict
  working: int
  gradients: int


LOSS_AND_INPUTS = "(loss and inputs)"


def step_tensors(model, batch: int, length: int | None = None) -> StepTensors:
  """Traces one training step of `model` for `batch` examples and counts what it keeps.

  Args:
    model: a built functional or Sequential Keras model; compiled, its loss is traced too.
    batch: the examples one device's step sees.
    length: the size of every input dimension the model leaves open (a sequence's length).

  Returns:
    A `StepTensors`.

  Raises:
    ValueError: the model leaves an input dimension open and `length` is None, or its inputs
      are unknown (a subclassed model that was never called on `keras.Input`s).

  Example:

  ```python
  import keras
  from tfdist.parallel.step_memory import step_tensors
  model = keras.Sequential([keras.Input((100, 8)), keras.layers.LSTM(16),
                            keras.layers.Dense(1)])
  model.compile("adam", "mse")
  kept = step_tensors(model, batch=4)
  assert kept.by_unit["lstm"] > 100 * 4 * 16 * 4  # Every step's state, not the last alone.
  ```
  """
  import tensorflow as tf
  from tfdist.parallel.placement import units

  inputs, targets = _specs(model, batch, length)

  def step(x, y):
    with tf.GradientTape() as tape:
      predicted = model(x, training=True)
      loss = _loss(model, x, y, predicted)
    return tape.gradient(loss, model.trainable_variables)
  named = list(units(model).items())
  with _scoped(layer for _, layer in named):
    traced = tf.function(step).get_concrete_function(inputs, targets)
  graph = traced.graph
  operations = graph.get_operations()
  buffer = _buffers(operations)
  backward = [op for op in operations if op.name.startswith(_GRADIENT_SCOPE)]
  kept = {buffer[t.name]: t for op in backward for t in op.inputs
          if not t.op.name.startswith(_GRADIENT_SCOPE) and t.op.type not in _NOT_KEPT}
  by_unit: dict[str, int] = {}
  for tensor in kept.values():
    found = _UNIT_SCOPE.findall(tensor.op.name)
    unit = named[int(found[-1])][0] if found else LOSS_AND_INPUTS
    by_unit[unit] = by_unit.get(unit, 0) + _bytes(tensor, length)
  sizes = {t.name: _bytes(t, length) for op in operations for t in op.outputs}
  returned = traced.structured_outputs
  gradients = [sum(_bytes(t, length) for t in tf.nest.flatten(g, expand_composites=True))
               for g in returned]
  update = max((UPDATE_COPIES * int(np.prod(v.shape)) * tf.as_dtype(v.dtype).size +
                (size if isinstance(g, tf.IndexedSlices) else 0)
                for v, g, size in zip(model.trainable_variables, returned, gradients)),
               default=0)
  gradients = sum(gradients)
  peak = max(_peak(order, buffer, sizes, graph.outputs)
             for order in (operations, _depth_first(operations)))
  kept_bytes = sum(by_unit.values())
  working = max(peak - kept_bytes - gradients, update, 0)
  return StepTensors(kept=kept_bytes, by_unit=by_unit, working=working, gradients=gradients)


# Temporaries of a variable's size live at once while an optimizer updates it (Adam: the step's
# numerator and the root of its second moment; the moments' differences come and go before);
# a sparse gradient (an embedding's rows) adds one copy of its slices (Keras squares them
# before it makes them dense).
UPDATE_COPIES = 2


def _buffers(operations) -> dict[str, str]:
  """{tensor name: the name of the tensor whose memory it is}: its own, or, for a view (a
  reshape), its input's; TensorFlow's kernels also write an output into an input of its shape
  that no other op reads (`forward_input_or_allocate_output`), as an element-wise op or the
  loss's softmax does. Operations in the order they were made (each after its inputs)."""
  buffer: dict[str, str] = {}
  for op in operations:
    if op.type in _VIEWS and op.inputs:
      for output in op.outputs:
        buffer[output.name] = buffer.get(op.inputs[0].name, op.inputs[0].name)
      continue
    free = {t.name: t for t in op.inputs
            if len(t.consumers()) == 1 and t.op.type not in _NOT_KEPT}
    for output in op.outputs:
      same = next((name for name, t in free.items() if t.dtype == output.dtype and
                   t.shape.is_fully_defined() and t.shape == output.shape), None)
      buffer[output.name] = buffer.get(same, same) if same else output.name
      free.pop(same, None)
  return buffer


def _peak(operations, buffer: dict, sizes: dict, outputs) -> int:
  """The most memory the step's tensors hold at once, the operations run one at a time in the
  order they were made: each buffer is made by the op that writes it first and freed after
  the last op that reads it (the step's outputs, its gradients, live to the end)."""
  last: dict[str, int] = {}
  for i, op in enumerate(operations):
    for t in op.inputs:
      last[buffer.get(t.name, t.name)] = i
  for t in outputs:
    last[buffer.get(t.name, t.name)] = len(operations)
  freed = collections.defaultdict(int)  # Bytes freed after each op.
  for name, end in last.items():
    freed[end] += sizes.get(name, 0)
  live = peak = 0
  for i, op in enumerate(operations):
    if op.type not in _NOT_KEPT:
      made = {t.name for t in op.outputs if buffer.get(t.name, t.name) == t.name}
      live += sum(sizes.get(name, 0) for name in made if name in last)
    peak = max(peak, live)
    live -= freed[i]
  return peak


def _depth_first(operations) -> list:
  """The operations in the order an executor that runs the newest ready op first takes them:
  the chain of input gradients runs ahead while each layer's kernel gradient still waits,
  keeping the gradient it reads. TensorFlow's executor takes orders between this and the
  order they were made (an MLP's step measured from 28.6 to 40.6 MiB in different processes)."""
  made = {op.name: i for i, op in enumerate(operations)}
  waits = {op.name: 0 for op in operations}
  readers = collections.defaultdict(list)
  for op in operations:
    for name in {t.op.name for t in op.inputs} | {c.name for c in op.control_inputs}:
      if name in made:
        waits[op.name] += 1
        readers[name].append(op)
  ready = [op for op in reversed(operations) if not waits[op.name]]
  order = []
  while ready:
    op = ready.pop()
    order.append(op)
    for reader in sorted(readers[op.name], key=lambda r: made[r.name]):
      waits[reader.name] -= 1
      if not waits[reader.name]:
        ready.append(reader)
  return order


_VIEWS = {"Reshape", "Identity", "Squeeze", "ExpandDims", "StopGradient", "Snapshot"}


# Each unit's ops are made under a name scope of its own while the step is traced: Keras's own
# scopes are made unique by TensorFlow ("dense" becomes "dense_1", "dense_1" "dense_1_2").
_UNIT_SCOPE = re.compile(r"(?:^|/)tfdistunit(\d+)x(?:_\d+)?/")


@contextlib.contextmanager
def _scoped(layers):
  """Each layer's `call` under the name scope `tfdistunit<i>x` while inside."""
  import tensorflow as tf
  layers = list(layers)

  def scoped(call, i):
    def call_in_scope(*args, **kwargs):
      with tf.name_scope(f"tfdistunit{i}x"):
        return call(*args, **kwargs)
    return call_in_scope
  for i, layer in enumerate(layers):
    layer.call = scoped(layer.call, i)
  try:
    yield
  finally:
    for layer in layers:
      del layer.call


def open_inputs(model) -> list[str]:
  """The names of `model`'s inputs with an open dimension after the batch's. Pure."""
  return [getattr(t, "name", "input") for t in _flat(_functional(model).input)
          if any(d is None for d in t.shape[1:])]


def _functional(model):
  """The functional graph of `model` (a Sequential's own), whose inputs and outputs are known.

  Raises:
    ValueError: a model without one (a subclassed model never called on `keras.Input`s).
  """
  import keras
  graph = getattr(model, "_functional", None) if isinstance(model, keras.Sequential) else model
  try:
    graph.input, graph.output
  except (AttributeError, ValueError) as e:
    raise ValueError("the model's inputs are unknown: build it on keras.Input (functional or "
                     "Sequential)") from e
  return graph


def _specs(model, batch: int, length: int | None):
  import tensorflow as tf
  from keras import tree

  graph = _functional(model)
  structure = graph.input
  open_ = open_inputs(model)
  if length is None and open_:
    raise ValueError(f"input {open_[0]!r} leaves a dimension open: give the length to count "
                     "it at")

  def spec(t, dtype=None):
    shape = [batch] + [length if d is None else d for d in t.shape[1:]]
    return tf.TensorSpec(shape, dtype or t.dtype)
  inputs = tree.map_structure(spec, structure)
  outputs = _flat(graph.output)
  losses = _flat(getattr(model, "loss", None)) or [None]
  targets = []
  for i, output in enumerate(outputs):
    sparse = "sparse" in _name(losses[min(i, len(losses) - 1)]).lower()
    shape = [batch] + [length if d is None else d for d in output.shape[1:]]
    targets.append(tf.TensorSpec(shape[:-1] if sparse else shape,
                                 "int32" if sparse else "float32"))
  return inputs, targets[0] if len(targets) == 1 else targets


def _loss(model, x, y, predicted):
  import tensorflow as tf
  if getattr(model, "loss", None) is not None:
    return model.compute_loss(x=x, y=y, y_pred=predicted)
  return tf.add_n([tf.reduce_mean(tf.cast(p, "float32")) for p in _flat(predicted)])


def _bytes(tensor, length: int | None) -> int:
  """A tensor's bytes; a loop's accumulator (a variant) holds an element a step."""
  import tensorflow as tf
  if tensor.dtype == tf.variant:
    return _accumulated_bytes(tensor, length)
  if tensor.dtype == tf.resource or not tensor.shape.is_fully_defined():
    return 0
  return tensor.shape.num_elements() * tensor.dtype.size


def _accumulated_bytes(tensor, length: int | None) -> int:
  """The bytes of a while loop's accumulator output: the element it pushes each step, times
  the loop's steps (`maximum_iterations`, as Keras's recurrent layers set it; else `length`).
  An element that is a variable's value, or an item of another list, is that buffer again:
  none of its own."""
  loop = tensor.op
  body = getattr(loop, "_body_graph", None)
  if loop.type not in ("While", "StatelessWhile") or body is None or len(loop.inputs) < 2:
    return 0
  push = body.outputs[tensor.value_index].op
  if push.type != "TensorListPushBack":
    return 0
  element = push.inputs[1]
  root = element
  while root.op.type == "Identity":
    root = root.op.inputs[0]
  if root.op.type in _ALIASES or not element.shape.is_fully_defined():
    return 0
  steps = _constant(loop.inputs[1]) or length or 1
  return element.shape.num_elements() * element.dtype.size * int(steps)


# Ops whose output is a buffer that exists anyway: a variable's value, a list's item.
_ALIASES = {"ReadVariableOp", "TensorListGetItem"}


def _constant(tensor) -> int | None:
  """The value of a loop's step bound: a constant, or the max of one (Keras's RNNs)."""
  from tensorflow.python.framework import tensor_util
  value = tensor_util.constant_value(tensor)
  if value is None and tensor.op.type == "Max":
    value = tensor_util.constant_value(tensor.op.inputs[0])
  return None if value is None else int(np.max(value))


def _name(loss) -> str:
  if loss is None:
    return ""
  if isinstance(loss, str):
    return loss
  return getattr(loss, "name", None) or getattr(loss, "__name__", type(loss).__name__)


def _flat(structure) -> list:
  from keras import tree
  return [] if structure is None else tree.flatten(structure)
