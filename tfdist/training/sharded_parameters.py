"""Parameter sharding (ZeRO stage 3, arXiv 1910.02054; PyTorch's FSDP) under mirrored and
multi_worker_mirrored: each of the N replicas holds 1/N of the trainable weights, beside its
1/N of the optimizer's state (stage 1) and of the reduced gradients (stage 2).

The weights are laid end to end and cut as stages 1 and 2 cut them (`reduce_scatter.
shard_size`, TensorFlow's ring chunks): one variable of a shard's size per replica
(`Parameters.flat`, a mirrored variable whose component on replica r holds r's shard). The
model's own Keras variables keep their names, shapes and dtypes but hold no value
(`_Sharded`). The weights are gathered in buckets, runs of consecutive weights of
`sharded_optimizer.PIECE_BYTES` or more (PyTorch FSDP's units, by size): the first read of a
weight in a step, in a replica, gathers its bucket (an all-reduce of each replica's part of
it, placed in zeros), and every read of the step takes its piece of that (a view of it); a
`tf.GradientTape` watches the piece as it would the variable, so Keras's `train_step`, a
subclass's own and a `tfdist.TrainingLoop` step run unchanged. The optimizer (stage 2's)
reduce-scatters each replica's gradients, updates its shard of the weights in the shard
variable and drops the step's gathered weights. A bucket lives until the last op that reads
it: the backward pass's product with its weights, so buckets are freed as the gradients
appear and a step holds the whole weights once, not beside the whole gradients (the whole
model in one gather held both: `tfdist.training.sharding_memory`). Nothing is recomputed:
FSDP's re-gather in the backward pass would need each layer's forward pass run again.

Reads outside a step (`get_weights`, `numpy`, `model.save`, a checkpoint) gather the variable's
value across the replicas (under multi_worker_mirrored a collective: every worker reads, as
Keras asks of a multi-worker save); writes (`set_weights`, `load_weights`, a backup restored)
write each replica's part of the value into its shard. The model `tfdist.fit` returns keeps its
weights sharded: Keras's own evaluate, predict and fit gather a bucket at a time as a step
does, `model.save` and `get_weights` a weight at a time, and `model.export` (a SavedModel needs
ordinary variables) holds the whole weights in host memory for its length (`whole_weights`).
`materialise` makes them ordinary variables again for good.

```yaml
training: {zero_stage: 3}
strategy: multi_worker_mirrored
```
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import control_flow_v2_func_graphs
from keras.src.backend.common import stateless_scope
from keras.src.backend.tensorflow.core import Variable as _KerasVariable  # Keras's TF variable
from tensorflow.python.eager import tape as tape_lib

import tfdist.progress as progress
from tfdist.training import reduce_scatter, sharded_optimizer


def refusal(model, optimizer) -> str | None:
  """Why the weights of `model` trained by `optimizer` cannot be sharded (a sentence), or None.

  Args:
    model: the built Keras model.
    optimizer: its optimizer (a LossScaleOptimizer's inner one is looked at).
  """
  inner = getattr(optimizer, "inner_optimizer", optimizer)
  variables = model.trainable_variables
  if not model.built or not variables:
    return "the model has no built trainable weights to shard (build it in model_fn)"
  constrained = [v.path for v in variables if v.constraint is not None]
  if constrained:
    return (f"a constraint rewrites a whole weight after each update ({constrained[0]}); "
            "each replica holds only its shard of it")
  if inner.weight_decay:
    return ("weight_decay decays whole weights outside the optimizer's update; each replica "
            "holds only its shard of them")
  if (inner.gradient_accumulation_steps or 1) > 1:
    return "gradient accumulation keeps a whole accumulator of every weight on every replica"
  dtypes = {v.dtype for v in variables}
  if len(dtypes) != 1:
    return f"the trainable weights must share one dtype to be laid end to end: {sorted(dtypes)}"
  return None


def install(model, optimizer, strategy) -> "Parameters":
  """Shards the trainable weights of `model` over the replicas of `strategy`: each replica
  keeps 1/N of them, updated by `optimizer`'s stage-2 shards. Call after the model is built
  and compiled and stage 2 installed (`sharded_optimizer.install(..., gradients=True)`), in or
  out of the strategy's scope, every worker at once.

  Args:
    model: a built Keras model (`refusal` says None).
    optimizer: its optimizer, stage 2 installed, not yet stepped.
    strategy: the run's MirroredStrategy or MultiWorkerMirroredStrategy.

  Returns:
    The `Parameters` holding the shards.

  Example:

  ```python
  strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
  with strategy.scope():
    model = make_model()
    model.compile(keras.optimizers.Adam(), "mse")
    sharded_optimizer.install(model.optimizer, strategy, gradients=True)
    held = install(model, model.optimizer, strategy)
  model.fit(x, y)          # each device holds half of the weights and of Adam's moments
  materialise(model)       # whole weights again
  ```
  """
  inner = getattr(optimizer, "inner_optimizer", optimizer)
  shards = inner.tfdist_shards
  variables = list(model.trainable_variables)
  # The optimizer finds a variable's slots by its TensorFlow variable's id: kept from before.
  keys = {id(v): inner._var_key(v) for v in variables}  # pylint: disable=protected-access
  own_key = inner._var_key  # pylint: disable=protected-access
  for holder in {id(optimizer): optimizer, id(inner): inner}.values():
    holder._var_key = lambda variable: keys.get(id(variable)) or own_key(variable)
  held = Parameters(variables, strategy, shards)
  shards.held = held
  for index, variable in enumerate(variables):
    variable._tfdist_held, variable._tfdist_index = held, index
    variable._tfdist_class, variable.__class__ = type(variable), _sharded(type(variable))
    variable._value = None  # The whole weight, freed.
  model._tfdist_parameters = held
  model.export = functools.partial(_export_whole, model.export, model)
  model.compile = functools.partial(_compile_whole, model.compile, model)
  return held


def _compile_whole(compile_method, model, *args, **kwargs):
  """Keras's `model.compile` of a model with sharded weights: a new optimizer (Keras's
  transfer-learning guide compiles again after unfreezing, so the trainable weights change)
  knows no shards, so the weights are made whole first (`materialise`), said in one line."""
  print("tfdist: compile after a sharded fit (training.zero_stage: 3): the weights are "
        "whole again on every replica; Keras's own fit trains them unsharded, tfdist.fit "
        "shards them again", flush=True)
  materialise(model)
  return compile_method(*args, **kwargs)


def _export_whole(export, model, filepath, *args, **kwargs):
  """Keras's `model.export` (a SavedModel for TF Serving holds ordinary variables) with the
  whole weights in host memory for its length (`whole_weights`)."""
  with whole_weights(model):
    return export(filepath, *args, **kwargs)


@contextlib.contextmanager
def whole_weights(model):
  """Within it, `model`'s sharded weights are ordinary variables in host memory holding the
  whole values (each gathered alone from the replicas' shards); after it, sharded again (a
  write within it is written into the shards). Every worker enters it at once (the gathers are
  collectives under multi_worker_mirrored). Nothing when the weights are not sharded.

  Args:
    model: a model `install` sharded (`tfdist.fit` with `training.zero_stage: 3`).

  Example:

  ```python
  history = tfdist.fit(make_model, x, y, config=config)   # stage 3: its weights stay sharded
  with whole_weights(history.model):
    tf.saved_model.save(history.model, "served")          # what needs real variables
  ```
  """
  held = getattr(model, "_tfdist_parameters", None)
  if held is None:
    yield model
    return
  with tf.device("/cpu:0"):
    whole = [tf.Variable(held.read(i), trainable=v.trainable, name=v.name)
             for i, v in enumerate(held.variables)]
  for variable, value in zip(held.variables, whole):
    variable.__class__, variable._value = variable._tfdist_class, value
  try:
    yield model
  finally:
    for index, (variable, value) in enumerate(zip(held.variables, whole)):
      variable.__class__, variable._value = _sharded(variable._tfdist_class), None
      held.write(index, value)


def materialise(model) -> None:
  """Gives `model`'s sharded weights their whole values back, as ordinary Keras variables of
  the strategy's, and leaves the optimizer at stage 2 (it updates whole weights again). Every
  worker calls it at once. Nothing when the model's weights are not sharded."""
  held = getattr(model, "_tfdist_parameters", None)
  if held is None:
    return
  values = [piece.numpy() for piece in held.whole_values()]  # One gather for them all.
  with held.strategy.scope():
    for variable, value in zip(held.variables, values):
      variable.__class__ = variable._tfdist_class
      del variable._tfdist_held, variable._tfdist_index, variable._tfdist_class
      variable._initialize(value)
  held.shards.held = None  # The optimizer updates whole weights again (stage 2).
  held.release()
  model._tfdist_parameters = None
  del model.export, model.compile  # Keras's own.


def describe_sharding(optimizer, variables, models) -> str | None:
  """The start line's words for every ZeRO stage installed: the optimizer's (stages 1 and 2,
  updating `variables`) and the weights of each of `models` (stage 3); None when nothing is
  sharded."""
  words = [sharded_optimizer.describe(optimizer, variables), *(describe(m) for m in models)]
  return "; ".join(w for w in words if w) or None


def describe(model) -> str | None:
  """The start line's words for sharded weights: the replicas and the bytes each no longer
  holds; None when not sharded."""
  held = getattr(model, "_tfdist_parameters", None)
  if held is None:
    return None
  whole, buckets = sum(held.sizes) * held.itemsize, len(held.buckets)
  return (f"weights sharded over {held.replicas} replicas, "
          f"{(whole - held.size * held.itemsize) / 2**20:.2f} MiB less on each, gathered in "
          f"{buckets} bucket{'s' if buckets > 1 else ''} a step "
          "(training.zero_stage: 2)")


class Parameters:
  """The shards of a model's trainable weights, one per replica, and their reads and writes."""

  def __init__(self, variables, strategy, shards):
    self.variables, self.strategy = list(variables), strategy
    self.shards = shards  # The optimizer's `sharded_optimizer._Shards`, which updates them.
    self.replica_of = shards.replica_of  # {device: its replica}
    self.replicas = strategy.num_replicas_in_sync
    self.shapes = [tuple(v.shape) for v in self.variables]
    self.sizes = [int(np.prod(s)) for s in self.shapes]
    self.dtype = self.variables[0].dtype
    self.itemsize = np.dtype(self.dtype).itemsize
    self.size = reduce_scatter.shard_size(sum(self.sizes), self.replicas, self.itemsize)
    self.launchers = reduce_scatter.replica_launchers(strategy)
    self.starts = [int(a) for a in np.cumsum([0, *self.sizes])]
    self.buckets = _buckets(self.sizes, max(1, sharded_optimizer.PIECE_BYTES // self.itemsize))
    self.bucket_of = {i: k for k, (first, end) in enumerate(self.buckets)
                      for i in range(first, end)}
    whole = np.concatenate([np.reshape(v.numpy(), -1) for v in self.variables])
    whole = np.pad(whole, [0, self.size * self.replicas - whole.size])
    with strategy.scope():  # Under multi_worker_mirrored a collective: every worker makes it.
      self.flat = tf.Variable(tf.zeros([self.size], self.dtype), trainable=False,
                              name="tfdist_weights_shard")
    self.components = {_canonical(c.device): c
                       for c in strategy.experimental_local_results(self.flat)}
    self.device_of = {r: d for d, r in self.replica_of.items() if d in self.components}
    for device, component in self.components.items():
      r = self.replica_of[device]
      component.assign(whole[r * self.size:(r + 1) * self.size])
    # {graph: {replica's device: the step's gathered pieces}}, and eager ones by device.
    self._gathered: dict = weakref.WeakKeyDictionary()
    self._eager: dict = {}

  # -- Reads. ---------------------------------------------------------------------------------

  def read(self, index: int) -> tf.Tensor:
    """Weight `index`'s value where it is read: in a replica, its piece of the step's gathered
    bucket (gathered at the bucket's first read); elsewhere gathered for this read."""
    if not (tf.distribute.has_strategy() and tf.distribute.in_cross_replica_context() is False
            and tf.distribute.get_strategy() is self.strategy):
      return self._whole(index)
    replica = tf.get_static_value(tf.distribute.get_replica_context().replica_id_in_sync_group)
    device = self.device_of[int(replica)]
    if tf.executing_eagerly():
      cache, around = self._eager, contextlib.nullcontext()
    else:
      graph = _step_graph()
      cache, around = self._gathered.setdefault(graph, {}), graph.as_default()
    bucket = self.bucket_of[index]
    if (device, bucket) not in cache:
      with around:  # In a loop's body (an RNN's scan) the step's graph gathers; the body captures.
        cache[device, bucket] = self._gather_bucket(device, bucket)
    return cache[device, bucket][index - self.buckets[bucket][0]]

  def _gather_bucket(self, device: str, bucket: int) -> list[tf.Tensor]:
    """The pieces of bucket `bucket`'s weights, gathered in replica `device`: each replica puts
    its part of the bucket's span in a buffer of zeros the span's length, and an all-reduce
    sums them (each element is one replica's: the sum is its value; a -0.0 reads +0.0). A
    span smaller than a shard lies across one or two replicas' shards, so an all-gather of
    equal parts would move N times it; the all-reduce moves 2(N-1)/N times it."""
    first, end = self.buckets[bucket]
    a, b = self.starts[first], self.starts[end]
    r = self.replica_of[device]
    lo, hi = max(a, r * self.size), min(b, (r + 1) * self.size)
    if hi > lo:
      part = self.components[device][lo - r * self.size:hi - r * self.size]
      buffer = tf.pad(part, [[lo - a, b - hi]])
    else:  # `Empty` is stateful: zeros of a constant (or of padding an empty slice) would be
      # folded into the graph by grappler and held between steps (measured: 4 MiB more).
      buffer = tf.raw_ops.Empty(shape=[b - a], dtype=self.dtype, init=True)
    return self._pieces(self.launchers[device].all_reduce(buffer), first, end)

  def whole_values(self) -> list[tf.Tensor]:
    """Every weight's whole value, from one gather of the shards."""
    return self._pieces(self._gathered_shards())

  def _whole(self, index: int) -> tf.Tensor:
    """Weight `index` alone, gathered from the replicas whose shards hold a part of it: each
    replica's part padded to the longest, so a read moves N times the weight, not the whole
    model (Keras's `get_weights` and a checkpoint read weight by weight)."""
    spans = self._spans(index)
    longest = min(self.sizes[index], self.size)  # No replica holds more of it than a shard.
    local = []
    for device in sorted(self.components, key=self.replica_of.__getitem__):
      at, _, held = spans[self.replica_of[device]]
      part = self.components[device][at:at + held] if held else tf.zeros([0], self.dtype)
      local.append(tf.pad(part, [[0, longest - held]]))
    gathered = tf.reshape(self._end_to_end(local), [self.replicas, longest])
    whole = tf.concat([gathered[r, :held] for r, (_, _, held) in enumerate(spans) if held], 0)
    return tf.reshape(whole, self.shapes[index])

  def _spans(self, index: int) -> list[tuple[int, int, int]]:
    """Each replica's part of weight `index`, in replica order: (where it starts in the
    replica's shard, where it starts in the weight, its length: 0 where it holds none)."""
    begin, end = self.starts[index], self.starts[index + 1]
    spans = []
    for r in range(self.replicas):
      lo, hi = max(begin, r * self.size), min(end, (r + 1) * self.size)
      spans.append((lo - r * self.size, lo - begin, max(0, hi - lo)))
    return spans

  def _gathered_shards(self) -> tf.Tensor:
    """Every replica's shard end to end, gathered across the replicas (under
    multi_worker_mirrored a collective: every worker reads)."""
    return self._end_to_end([self.components[d].read_value() for d in sorted(
        self.components, key=self.replica_of.__getitem__)])

  def _end_to_end(self, local) -> tf.Tensor:
    """This process's replicas' `local` tensors (of one length, in replica order) and every
    other replica's, end to end in replica order."""
    with progress.collective(progress.Collective.SHARDED_GATHER):
      return self.shards._gather(self.strategy, local)  # pylint: disable=protected-access

  def _pieces(self, flat, first: int = 0, end: int | None = None) -> list[tf.Tensor]:
    """The pieces of weights `first` to `end` (all by default) of the gathered `flat`, which
    holds them end to end from weight `first`'s start: slices, which TensorFlow's CPU and GPU
    kernels hand out as views where they start and end on 64 bytes (`tf.split` of a vector
    copies every piece: the gathered weights held twice, measured)."""
    at = self.starts[first]
    return [tf.reshape(flat[self.starts[i] - at:self.starts[i + 1] - at], self.shapes[i])
            for i in range(first, len(self.sizes) if end is None else end)]

  def forget(self) -> None:
    """Drops the gathered weights of the graph being traced (and eager ones): the shards were
    written, the next read gathers them anew."""
    self._eager.clear()
    if not tf.executing_eagerly():  # The update may sit in a cond's branch (loss scaling).
      for graph in _enclosing_graphs():
        self._gathered.pop(graph, None)

  # -- Writes. --------------------------------------------------------------------------------

  def component(self, device: str):
    """The shard variable's component on `device` (a replica's shard)."""
    return self.components[_canonical(device)]

  def write(self, index: int, value) -> None:
    """Weight `index` set to `value` (whole): each replica's part written into its shard."""
    flat = tf.reshape(tf.cast(value, self.dtype), [-1])
    spans = self._spans(index)
    for device, component in self.components.items():
      at, start, held = spans[self.replica_of[device]]
      if held:  # Dense: a strided-slice write would copy the shard at each read from then on.
        shard = component.read_value()
        component.assign(tf.concat([shard[:at], flat[start:start + held], shard[at + held:]], 0))
    self.forget()

  def release(self) -> None:
    self.flat = self.components = None
    self._gathered, self._eager = weakref.WeakKeyDictionary(), {}


def _buckets(sizes: list[int], least: int) -> list[tuple[int, int]]:
  """The weights (by index, in order) in runs gathered together: (first, end) of each run,
  each closed once it holds `least` elements or more, the last whatever is left."""
  runs, first, held = [], 0, 0
  for index, size in enumerate(sizes):
    held += size
    if held >= least:
      runs.append((first, index + 1))
      first, held = index + 1, 0
  if first < len(sizes):
    runs.append((first, len(sizes)))
  return runs


@functools.cache
def _sharded(variable_class: type) -> type:
  """`variable_class` (Keras's TensorFlow variable, or a subclass) whose value lives in the
  replicas' shards."""
  return type(f"Sharded{variable_class.__name__}", (_Sharded, variable_class), {})


class _Sharded(sharded_optimizer.ReadWhole, _KerasVariable):
  """A model's Keras variable whose value lives in the replicas' shards (`Parameters`): its
  name, shape, dtype, path and trainability are the variable's; reading it gives the gathered
  value (`handle` too: a GradientTape watches it), assigning it writes the shards. Mixed into
  the variable's own class (`_sharded`), which `materialise` gives back."""

  @property
  def value(self):
    scope = stateless_scope.get_stateless_scope()  # Keras's stateless_call: its values.
    if scope is not None and (given := scope.get_current_value(self)) is not None:
      return self._maybe_autocast(given)
    held = self.handle
    if self.trainable:
      tape_lib.variable_accessed(self)  # The tapes watch `handle`: gradients reach the piece.
    return self._maybe_autocast(held)

  @property
  def handle(self):
    return self._tfdist_held.read(self._tfdist_index)

  def _direct_assign(self, value):
    self._tfdist_held.write(self._tfdist_index, value)

  @property
  def _shared_name(self):
    return self.name


def _step_graph():
  """The graph a replica's step is being traced in: the graph being traced, or, from a while
  loop's body or a cond's branch entered inside the replica's function (Keras's recurrent
  layers read their weights in a `tf.while_loop`), the graph around them up to the one the
  replica's function began in (`mirrored_run`'s replica thread's `graph`; a loop of steps
  around it holds updates, so its body is as far as a gather goes). A gather made in the
  recurrent layer's body would run once an iteration, and a GradientTape cannot reach a
  tensor made there (the layer's weights had no gradient, found 2026-11-29 with a GRU)."""
  graph = tf.compat.v1.get_default_graph()
  began = getattr(threading.current_thread(), "graph", None)
  if began is None:  # Not a replica's thread: the graph being traced.
    return graph
  while graph is not began and isinstance(graph, control_flow_v2_func_graphs.ControlFlowFuncGraph):
    graph = graph.outer_graph
  return graph


def _enclosing_graphs():
  """The graph being traced and every graph around it."""
  graph = tf.compat.v1.get_default_graph()
  while graph is not None:
    yield graph
    graph = getattr(graph, "outer_graph", None)


def _canonical(device: str) -> str:
  return tf.DeviceSpec.from_string(device).to_string()
