"""Optimizer-state sharding (ZeRO stage 1, arXiv 1910.02054) under mirrored and
multi_worker_mirrored: each of the N replicas keeps the optimizer's slots (Adam's two moments,
SGD's momentum) for 1/N of the weights only, instead of a whole copy each.

The trainable variables are laid end to end in one flat vector, cut into N equal shards (the
last padded); replica r's slots are variables of one shard's size. Each step, after Keras's
all-reduce of the gradients (TensorFlow's collectives offer no reduce-scatter under these
strategies, and none at all on CPU: tests/test_sharded_optimizer.py, BUILD_NOTES.md), replica
r updates its shard of the weights with its shard of the gradients and its slots (the
optimizer's own `update_step`, elementwise, so the arithmetic is the unsharded one's), and the
updated shards are all-gathered into every replica's weights, a piece at a time (`PIECE_BYTES`),
each variable assigned whole once its pieces have arrived: per step an all-reduce of the
gradients plus an all-gather of the weights. The shard of the weights being updated is a
tensor inside the step (`_Shard`), not a variable: a replica holds nothing beyond its slots'
shards, 1/N of the unsharded optimizer's state.

Stage 2 (`gradients=True`, `training.zero_stage: 2`): Keras's all-reduce of the gradients is
left out, and each replica gets its shard of their sum by a reduce-scatter
(`tfdist.training.reduce_scatter`: TensorFlow's AllToAll, summed as its ring all-reduce sums):
the reduced gradients take 1/N of the bytes, and a replica sends (N-1)/N of them instead of
2(N-1)/N. The shard is reduce-scattered in pieces (`PIECE_BYTES`), one after another. The
shards are cut as TensorFlow's ring cuts its chunks (`reduce_scatter.shard_size`) in both
stages, so either resumes the other's files.

Files stay whole: the optimizer saves and loads its variables in the order and shapes the
unsharded optimizer has (each slot gathered from its shards), so `model.save`, ModelCheckpoint
and tfdist's backup write ordinary files, loadable by plain Keras and resumable sharded.
Under multi_worker_mirrored every worker must save at once (gathering is a collective), as
Keras already asks of a multi-worker save.

```yaml
training: {zero_stage: 1}
strategy: multi_worker_mirrored
```
"""

from __future__ import annotations

import functools
import types

import keras
import numpy as np
import tensorflow as tf

import tfdist.progress as progress
from keras.src.backend.tensorflow.core import Variable as _KerasVariable  # Keras's TF variable
from keras.src.optimizers.base_optimizer import BaseOptimizer

from tfdist.strategy import gradient_reduction
from tfdist.training import reduce_scatter

PIECE_BYTES = 1 << 20
"""Each replica's shard is gathered into the weights (stages 1 and 2) this many bytes of it at a
time (one all-gather of N such pieces), and reduce-scattered (stage 2) this many bytes in all
at a time (PIECE_BYTES / N of each replica's shard in one all-to-all), each collective after
the one before, so one piece's buffers live at once. A step's transient bytes per process
(2 MWMS workers, 8.04 MiB of weights, `tests/programs/step_peak.py`, 2026-11-28): stage 1
28.1 MiB whole, 20.1 in pieces; on 4 logical CPUs (2026-11-29) stage 2's scatter pieces of
PIECE_BYTES in all took its fit's transient from 102.3 MiB (N x PIECE_BYTES) to 91.5, under
stage 1's 94.5."""

# Optimizers whose update is elementwise in every variable: an update of the flat shard is the
# unsharded update's. (Lamb's trust ratio and Adafactor's factored moments are per variable;
# Nadam and Muon keep per-step state outside `update_step`.)
SHARDABLE = ("SGD", "Adam", "AdamW", "Adamax", "RMSprop", "Adagrad", "Adadelta", "Lion")


def refusal(optimizer, gradients: bool = False) -> str | None:
  """Why `optimizer` cannot be sharded (a sentence), or None; `gradients`: the gradients are
  sharded too (stage 2 or 3: an optimizer without state still has them to shard)."""
  inner = getattr(optimizer, "inner_optimizer", optimizer)
  name = type(inner).__name__
  if name not in SHARDABLE or type(inner).__module__.split(".")[0] != "keras":
    return (f"{name}'s update is not one Keras optimizer's elementwise update; shardable: "
            f"{', '.join(SHARDABLE)}")
  if name == "SGD" and not inner.momentum and not gradients:
    return ("SGD without momentum keeps no state to shard (its gradients can be: "
            "training.zero_stage: 2)")
  if getattr(inner, "use_ema", False):
    return "an optimizer with use_ema keeps whole averages of every weight on every replica"
  return None


def install(optimizer, strategy, gradients: bool = False) -> None:
  """Makes `optimizer` (or the optimizer a LossScaleOptimizer wraps) keep its slots sharded over
  the replicas of `strategy`. Call before the optimizer is built, in or out of the strategy's
  scope.

  Args:
    optimizer: a Keras optimizer of `SHARDABLE`, unbuilt.
    strategy: the run's MirroredStrategy or MultiWorkerMirroredStrategy.
    gradients: also shard the gradients (stage 2): a reduce-scatter instead of the all-reduce.

  Example:

  ```python
  strategy = tf.distribute.MirroredStrategy(["CPU:0", "CPU:1"])
  with strategy.scope():
    model = make_model()
    optimizer = keras.optimizers.Adam()
    install(optimizer, strategy)
    model.compile(optimizer, "mse")
  model.fit(x, y)   # each device holds half of Adam's moments
  ```
  """
  inner = getattr(optimizer, "inner_optimizer", optimizer)
  if inner.built:
    raise ValueError("shard the optimizer before it is built (before its first step)")
  state = _Shards(inner, strategy, gradients)
  inner.tfdist_shards = state
  if gradients:  # Each replica's own dense gradients reach the update, which reduces its shard
    # there; a sparse one (an Embedding's rows) is summed as Keras sums it (every replica's rows).
    gradient_reduction.wrap(inner, _sparse_reduced)
  inner.build = types.MethodType(lambda self, variables: state.build(variables), inner)
  inner.__class__ = _showing_whole_state(type(inner))
  inner._distributed_tf_update_step = types.MethodType(
      lambda self, distribution, grads_and_vars, learning_rate: state.update(
          distribution, grads_and_vars, learning_rate), inner)
  for holder in {id(optimizer): optimizer, id(inner): inner}.values():
    own = holder._variables if holder is not inner else []
    holder.save_own_variables = types.MethodType(
        lambda self, store, own=own: state.save(store, own), holder)
    holder.load_own_variables = types.MethodType(
        lambda self, store, own=own: state.load(store, own), holder)


def _sparse_reduced(reduce, grads_and_vars):
  """Stage 2's reduction: the sparse gradients' (`reduce`, Keras's all-reduce: each replica's
  rows gathered); the dense ones left as they are (reduce-scattered by the update)."""
  pairs = list(grads_and_vars)
  sparse = [i for i, (g, _) in enumerate(pairs) if isinstance(g, tf.IndexedSlices)]
  if sparse:
    for i, reduced in zip(sparse, reduce([pairs[i] for i in sparse])):
      pairs[i] = reduced
  return pairs


def describe(optimizer, variables) -> str | None:
  """The start line's words for a sharded `optimizer` updating `variables`: its slots per
  weight, the replicas, and the bytes each replica no longer holds; None when not sharded."""
  inner = getattr(optimizer, "inner_optimizer", optimizer)
  state = getattr(inner, "tfdist_shards", None)
  if state is None:
    return None
  weights = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables)
  n = state.replicas
  saved = state.slots_per_weight * weights * (n - 1) / n
  words = (f"{type(inner).__name__}'s state sharded over {n} replicas, "
           f"{saved / 2**20:.2f} MiB less on each (training.zero_stage: 0)")
  if state.scatter:
    words += (f"; gradients reduce-scattered, {weights * (n - 1) / n / 2**20:.2f} MiB of "
              "reduced gradients less on each (training.zero_stage: 1)")
  return words


class _Shard:
  """What the shard optimizer updates: replica r's shard of the weights as a tensor inside the
  step (no variable holds it). Keras's optimizers read a variable's `dtype`, find its slots by
  `_var_key` (`_unique_id` under TensorFlow) and change it only through `assign`,
  `assign_add` and `assign_sub`: each makes the next value here."""

  def __init__(self, size: int, dtype: str, name: str):
    self.shape, self.dtype, self.name, self.path = (size,), dtype, name, name
    self._unique_id = f"tfdist/{name}"
    self.trainable = True
    self.value = None

  def assign(self, value):
    self.value = tf.convert_to_tensor(value, self.dtype)

  def assign_add(self, value):
    self.value = self.value + value

  def assign_sub(self, value):
    self.value = self.value - value

  # A sparse gradient's rows (Adagrad's update of the weights): IndexedSlices over the shard.
  def scatter_update(self, slices):
    self.value = tf.tensor_scatter_nd_update(self.value, slices.indices[:, None], slices.values)

  def scatter_add(self, slices):
    self.value = tf.tensor_scatter_nd_add(self.value, slices.indices[:, None], slices.values)

  def scatter_sub(self, slices):
    self.value = tf.tensor_scatter_nd_sub(self.value, slices.indices[:, None], slices.values)


class _Shards:
  """The flat layout of a sharded optimizer, its shard optimizer and its whole-file order."""

  def __init__(self, optimizer, strategy, scatter: bool = False):
    self.optimizer, self.strategy, self.scatter = optimizer, strategy, scatter
    self.held = None  # Stage 3's `sharded_parameters.Parameters`: the weights' own shards.
    self.parameters = False  # Stage 3 asked for (`settings.shard_parameters` installs it).
    self.replicas = strategy.num_replicas_in_sync
    ids = strategy.experimental_distribute_values_from_function(
        lambda context: context.replica_id_in_sync_group)
    devices = strategy.extended.worker_devices
    self.replica_of = {tf.DeviceSpec.from_string(d).to_string(): int(i)
                       for d, i in zip(devices, strategy.experimental_local_results(ids))}
    twin = type(optimizer).from_config(optimizer.get_config())
    with strategy.scope():  # Every replica installs it: a collective variable is fine here.
      stand_in = keras.Variable(np.zeros([1], "float32"), name="w0")
    self.slots_per_weight = len(_made_by(twin, lambda: twin.build([stand_in])))

  def build(self, variables):
    """Builds the optimizer without slots, then its shard optimizer over one flat shard."""
    from keras.src.optimizers.base_optimizer import BaseOptimizer
    optimizer = self.optimizer
    BaseOptimizer.build(optimizer, variables)
    dtypes = {v.dtype for v in variables}
    if len(dtypes) != 1:
      raise ValueError(f"training.zero_stage: the trainable variables must share one dtype "
                       f"to be laid end to end; received {sorted(dtypes)}")
    self.shapes = [tuple(v.shape) for v in variables]
    self.sizes = [int(np.prod(s)) for s in self.shapes]
    self.size = reduce_scatter.shard_size(sum(self.sizes), self.replicas,
                                          np.dtype(variables[0].dtype).itemsize)
    self.piece = max(1, PIECE_BYTES // np.dtype(variables[0].dtype).itemsize)
    if self.scatter:
      self.launchers = reduce_scatter.replica_launchers(self.strategy)
    config = {**optimizer.get_config(), "weight_decay": None, "clipnorm": None,
              "clipvalue": None, "global_clipnorm": None, "gradient_accumulation_steps": None,
              "name": f"{optimizer.name}_shard"}
    shard = type(optimizer).from_config(config)
    shard._iterations = optimizer._iterations  # Adam's bias correction counts the real steps.
    self.weights = _Shard(self.size, dtypes.pop(), f"{optimizer.name}_weights_shard")
    # Slots shaped as the shard, made without TensorFlow's colocation with a variable (there is
    # none), each a mirrored variable whose component on replica r holds r's shard.
    shard.add_variable_from_reference = types.MethodType(BaseOptimizer.add_variable_from_reference,
                                                         shard)
    with self.strategy.scope():
      self.slots = _made_by(shard, lambda: shard.build([self.weights]))
    names = sorted(self.slots)  # Every save gathers them: one function, traced once.
    self._gather_slots = tf.function(
        lambda: [self._gather(self.strategy, [c.read_value() for c in
                                              self.strategy.experimental_local_results(
                                                  self.slots[n].value)])
                 for n in names])
    self.shard = shard  # Keras's own update_step: a fused kernel needs a variable to update.
    if names:  # Places each replica's update on its device.
      self.anchor = self.slots[names[0]]
    else:  # An optimizer without state (SGD without momentum, stages 2-3): one element a replica.
      with self.strategy.scope():
        self.anchor = keras.Variable(np.zeros([1], "float32"), trainable=False,
                                     name=f"{optimizer.name}_anchor")
    self.order = self.whole_order()
    self.views = {key: _SlotView(self, key, variables[key[0]])
                  for key in self.order if isinstance(key, tuple)}
    optimizer.built = True

  def update(self, distribution, grads_and_vars, learning_rate):
    """Cross-replica: each replica updates its shard; the shards are gathered into the weights."""
    grads = [g for g, _ in grads_and_vars]
    variables = [v for _, v in grads_and_vars]
    if len(variables) != len(self.sizes):
      raise ValueError("training.zero_stage: every trainable variable needs a gradient "
                       f"each step; {len(self.sizes) - len(variables)} had none")
    # Adam's bias correction counts updates: Keras's `iterations` divides the batches counted
    # by the accumulation steps, the shard optimizer's the same.
    self.shard.gradient_accumulation_steps = self.optimizer.gradient_accumulation_steps

    held = self.held

    def update_shard(slot, *values):
      device = tf.DeviceSpec.from_string(slot.device).to_string()
      replica = self.replica_of[device]
      grads = values[:len(self.sizes)]
      if held is not None:  # Stage 3: the weights' shard is a variable of its own.
        self.weights.assign(held.component(device).read_value())
      else:
        self.weights.assign(self._slice(values[len(self.sizes):], replica))
      # A gradient summed from several uses of a weight may have lost its static shape.
      dense = [None if isinstance(g, tf.IndexedSlices) else tf.reshape(g, shape)
               for g, shape in zip(grads, self.shapes)]
      if self.scatter:  # This replica's own dense gradients: its shard of their sum.
        gradient = self._scattered(dense, replica, self.launchers[device])
      else:  # Summed already (Keras's all-reduce): its shard of them.
        gradient = self._slice(dense, replica)
      gradient = self._with_sparse(gradient, grads, replica)
      self.shard.update_step(gradient, self.weights, learning_rate)
      if held is not None:
        held.component(device).assign(self.weights.value)
      return tf.identity(self.weights.value)
    if held is not None:  # The model's variables hold nothing to read: the gradients alone.
      distribution.extended.update(self.anchor.value, update_shard, args=tuple(grads),
                                   group=False)
      held.forget()
      return
    shards = distribution.extended.update(self.anchor.value, update_shard,
                                          args=(*grads, *variables), group=False)
    self._write_gathered(distribution, shards if isinstance(shards, (tuple, list)) else [shards],
                         variables)

  def _with_sparse(self, gradient, grads, replica: int):
    """The shard's `gradient` (dense, zero where a sparse gradient's weight lies) with the rows
    of each sparse gradient (an Embedding's IndexedSlices, summed over the replicas as Keras
    sums them: every replica's rows, an index repeated as often as it was looked up) that fall
    in replica `replica`'s shard: one IndexedSlices over the shard, so that the optimizer's own
    `update_step` treats every looked-up row as plain Keras does on one device (Keras squares
    a repeated row's gradients one by one, `keras/src/backend/tensorflow/sparse.py`
    `elementwise_unary`: Adam's second moment is not the square of their sum). Unchanged when
    no gradient is sparse."""
    sparse = [(j, g) for j, g in enumerate(grads) if isinstance(g, tf.IndexedSlices)]
    if not sparse:
      return gradient
    starts = np.cumsum([0, *self.sizes])
    index = tf.int32 if self.size * self.replicas < 2**31 else tf.int64
    begin, values = replica * self.size, [gradient]
    indices = [tf.range(self.size, dtype=index)]
    for j, g in sparse:
      row = int(np.prod(self.shapes[j][1:]))
      at = (tf.cast(g.indices, index)[:, None] * row + tf.range(row, dtype=index)[None, :]
            + int(starts[j]) - begin)
      at, rows = tf.reshape(at, [-1]), tf.reshape(tf.cast(g.values, gradient.dtype), [-1])
      mine = (at >= 0) & (at < self.size)
      values.append(tf.boolean_mask(rows, mine))
      indices.append(tf.boolean_mask(at, mine))
    return tf.IndexedSlices(tf.concat(values, 0), tf.concat(indices, 0),
                            tf.constant([self.size], index))

  def _write_gathered(self, distribution, local, variables):
    """Every replica's updated shard written into `variables`: piece i of every shard gathered
    in one all-gather, each after the one before, and each variable assigned whole, once, as
    soon as its last segment has arrived (the pieces it needs live until then). A dense
    assignment, not a strided-slice one into the variable: TensorFlow's sparse writes put a
    variable in copy-on-read mode for good (`EnsureSparseVariableAccess`), after which every
    read of it, each step's forward pass included, copies it whole
    (`test_stage_2_in_pieces_equals_plain_keras`)."""
    starts = np.cumsum([0, *self.sizes])
    segments = [[] for _ in variables]  # Per variable: (where it starts in it, the tensor).
    missing = list(self.sizes)
    after = []
    for begin, length in self._spans():
      with tf.control_dependencies(after):
        gathered = self._gather(distribution, [shard[begin:begin + length] for shard in local])
      after = [gathered]
      for k in range(self.replicas):
        at = k * self.size + begin  # Where gathered[k * length] lies, end to end.
        for j, variable in enumerate(variables):
          a, b = max(at, starts[j]), min(at + length, starts[j] + self.sizes[j])
          if a >= b:
            continue
          segments[j].append((a - starts[j], gathered[k * length + a - at:k * length + b - at]))
          missing[j] -= b - a
          if missing[j]:
            continue
          parts = [t for _, t in sorted(segments[j], key=lambda s: s[0])]
          value = tf.reshape(tf.concat(parts, 0) if len(parts) > 1 else parts[0],
                             self.shapes[j])
          segments[j] = None
          wrote = distribution.extended.update(variable, _write_whole, args=(value,),
                                               group=False)
          after += wrote if isinstance(wrote, (tuple, list)) else [wrote]

  def _scattered(self, grads, replica: int, launcher):
    """Replica `replica`'s shard of the sum of every replica's `grads`, reduce-scattered a piece
    at a time: piece i of each replica's shard in one all-to-all, each after the one before, so
    one piece's buffers live at once and no whole-size copy of the gradients is made."""
    pieces, done = [], []
    for begin, length in self._spans(max(1, self.piece // self.replicas)):
      with tf.control_dependencies(done):
        flat = tf.concat([self._range(grads, k * self.size + begin, length)
                          for k in range(self.replicas)], 0)
      done = [reduce_scatter.reduce_scatter(launcher, flat, replica, self.replicas)]
      pieces.append(done[0])
    return tf.concat(pieces, 0) if len(pieces) > 1 else pieces[0]

  def _spans(self, piece: int | None = None):
    """(begin, length) of each piece of a shard (`piece` elements, default `PIECE_BYTES`'),
    in order."""
    piece = piece or self.piece
    return [(begin, min(piece, self.size - begin)) for begin in range(0, self.size, piece)]

  def _slice(self, tensors, replica: int):
    """Replica `replica`'s shard of `tensors` laid end to end (padded with zeros)."""
    return self._range(tensors, replica * self.size, self.size)

  def _range(self, tensors, begin: int, length: int):
    """Elements [begin, begin + length) of `tensors` laid end to end (zeros past the end): the
    pieces of the variables the range covers, cut where they lie (no whole-size copy)."""
    end = begin + length
    pieces, start = [], 0
    for tensor, size in zip(tensors, self.sizes):
      a, b = max(begin, start), min(end, start + size)
      if a < b:
        pieces.append(tf.zeros([b - a], self.weights.dtype) if tensor is None else
                      tf.reshape(tensor, [-1])[a - start:b - start])
      start += size
    covered = sum(int(p.shape[0]) for p in pieces)
    if covered < length:
      pieces.append(tf.zeros([length - covered], self.weights.dtype))
    return tf.concat(pieces, 0) if len(pieces) > 1 else pieces[0]

  def _pieces(self, whole):
    starts = np.cumsum([0, *self.sizes])
    return [tf.reshape(whole[a:a + n], s) for a, n, s in zip(starts, self.sizes, self.shapes)]

  def _gather(self, distribution, local):
    """Every replica's shard, end to end, from this process's replicas' shards (in the order of
    its devices): a concatenation, or an all-gather across workers."""
    local = list(local)
    if len(local) == self.replicas:  # One process holds every replica.
      return tf.concat(local, 0)
    first = min(self.replica_of.values())
    shards = distribution.experimental_distribute_values_from_function(
        lambda context: local[context.replica_id_in_sync_group - first])
    return distribution.gather(shards, axis=0)

  # -- Files: the unsharded optimizer's variables, in its order. ------------------------------

  def whole_order(self):
    """[(variable index, slot name) or the optimizer's own variable's name] in the order the
    unsharded optimizer keeps its variables; read from a twin built over stand-ins of one
    element (the order and names do not depend on shapes for `SHARDABLE` optimizers)."""
    twin = type(self.optimizer).from_config(self.optimizer.get_config())
    with self.strategy.scope():
      stand_ins = [keras.Variable(np.zeros([1], self.weights.dtype), name=f"w{i}")
                   for i in range(len(self.sizes))]
    made = _made_by(twin, lambda: twin.build(stand_ins), key=lambda ref: int(ref.name[1:]))
    slots = {id(v): key for key, v in made.items()}
    return [slots.get(id(v), v.name) for v in twin.variables]

  def _whole_slots(self) -> dict:
    """{(variable index, slot name): the slot's whole value (NumPy)}, gathered from shards."""
    with progress.collective(progress.Collective.SHARDED_GATHER):
      gathered = self._gather_slots()
    return {(i, name): piece.numpy() for name, whole in zip(sorted(self.slots), gathered)
            for i, piece in enumerate(self._pieces(whole))}

  def slot_piece(self, key) -> tf.Tensor:
    """Slot `key` ((variable index, slot name)) of one weight, whole, gathered from the
    replicas' shards of that slot (under multi_worker_mirrored a collective: every worker
    reads)."""
    index, name = key
    local = [c.read_value() for c in self.strategy.experimental_local_results(
        self.slots[name].value)]
    with progress.collective(progress.Collective.SHARDED_GATHER):
      whole = self._gather(self.strategy, local)
    return self._pieces(whole)[index]

  def write_slot_piece(self, key, value) -> None:
    """Slot `key` of one weight set to `value` (whole): each replica's part in its shard."""
    index, name = key
    begin = int(sum(self.sizes[:index]))
    flat = np.reshape(np.asarray(value, self.weights.dtype), -1)
    for component in self.strategy.experimental_local_results(self.slots[name].value):
      replica = self.replica_of[tf.DeviceSpec.from_string(component.device).to_string()]
      lo, hi = replica * self.size, (replica + 1) * self.size
      a, b = max(begin, lo), min(begin + flat.size, hi)
      if b > a:
        shard = component.numpy()
        shard[a - lo:b - lo] = flat[a - begin:b - begin]
        component.assign(shard)

  def save(self, store, own_first) -> None:
    values = self._whole_slots()
    own = {v.name: v for v in self.optimizer._variables}
    entries = [v.numpy() for v in own_first]
    entries += [values[key] if isinstance(key, tuple) else own[key].numpy()
                for key in self.order]
    for i, value in enumerate(entries):
      store[str(i)] = value

  def load(self, store, own_first) -> None:
    order = self.order
    if len(store.keys()) != len(own_first) + len(order):
      raise ValueError(f"training.zero_stage: the saved optimizer has {len(store.keys())} "
                       f"variables; this one, unsharded, has {len(own_first) + len(order)}")
    for i, v in enumerate(own_first):
      v.assign(store[str(i)])
    own = {v.name: v for v in self.optimizer._variables}
    flat = {}
    for i, key in enumerate(order, start=len(own_first)):
      if isinstance(key, tuple):
        flat.setdefault(key[1], [None] * len(self.sizes))[key[0]] = np.reshape(store[str(i)], -1)
      else:
        own[key].assign(store[str(i)])
    for name, pieces in flat.items():
      whole = np.concatenate(pieces)
      whole = np.pad(whole, [0, self.size * self.replicas - whole.size])
      for component in self.strategy.experimental_local_results(self.slots[name].value):
        replica = self.replica_of[tf.DeviceSpec.from_string(component.device).to_string()]
        component.assign(whole[replica * self.size:(replica + 1) * self.size])


def _write_whole(variable, value):
  """`variable` set to `value` (a dense assignment); returns a tensor that follows the write."""
  handle = getattr(variable, "handle", None)
  if handle is None:  # A Keras variable: its TensorFlow variable.
    handle = variable.value.handle
  wrote = tf.raw_ops.AssignVariableOp(resource=handle, value=value)
  with tf.control_dependencies([wrote]):
    return tf.constant(0)


def _made_by(optimizer, build, key=lambda ref: None) -> dict:
  """{slot key: variable} of the slots `build()` makes on `optimizer`: the key is the slot's
  name, or (key(reference variable), name) when `key` names references."""
  made = {}
  add = optimizer.add_variable_from_reference

  def recorded(reference_variable, name=None, **kwargs):
    variable = add(reference_variable, name=name, **kwargs)
    index = key(reference_variable)
    made[name if index is None else (index, name)] = variable
    return variable
  optimizer.add_variable_from_reference = recorded
  try:
    build()
  finally:
    del optimizer.add_variable_from_reference
  return made


@functools.cache
def _showing_whole_state(optimizer_class: type) -> type:
  """`optimizer_class` whose `variables` are the unsharded optimizer's, in its order and
  shapes: its own (iterations, learning rate) and, for each slot of each weight, a `_SlotView`.
  Keras's `summary` counts them and `get_state_tree` reads them as it would plain Keras's. The
  class keeps the optimizer's name and module: a saved model names the optimizer's own."""

  def variables(self):
    state = getattr(self, "tfdist_shards", None)  # None in a twin made from the config.
    own = BaseOptimizer.variables.fget(self)
    if not getattr(state, "views", None):
      return own
    by_name = {v.name: v for v in own}
    return [state.views[key] if isinstance(key, tuple) else by_name[key] for key in state.order]

  return type(optimizer_class.__name__, (optimizer_class,), {
      "variables": property(variables), "__module__": optimizer_class.__module__,
      "__qualname__": optimizer_class.__qualname__})


class ReadWhole:
  """A Keras variable whose value is gathered from shards on read (stage 3's weights, a slot's
  view): a checkpoint saves the gathered value and restores it through `assign`."""

  def _serialize_to_tensors(self):
    return {"VARIABLE_VALUE": self.value}

  def _restore_from_tensors(self, restored_tensors):
    self.assign(restored_tensors["VARIABLE_VALUE"])
    return self.value


class _SlotView(ReadWhole, _KerasVariable):
  """One slot of one weight as the unsharded optimizer holds it (Adam's `velocity` of a
  kernel): its name, path, shape and dtype are Keras's; it holds nothing. Reading it gathers
  that slot's parts from the replicas' shards (every worker at once, as for a save);
  assigning it writes them."""

  def __init__(self, shards: "_Shards", key, reference):  # pylint: disable=super-init-not-called
    optimizer = shards.optimizer
    self._shards, self._key = shards, key
    self._name = f"{reference.path.replace('/', '_')}_{key[1]}"  # As Keras names a slot.
    self._path = f"{optimizer.name}/{self._name}"
    self._shape, self._ndim = tuple(reference.shape), len(reference.shape)
    self._dtype = shards.weights.dtype
    self._trainable, self._autocast, self._overwrite_with_gradient = False, False, False
    self._aggregation, self._synchronization, self._layout = "none", "auto", None
    self._initializer = self._regularizer = self._constraint = self._value = None

  @property
  def value(self):
    return self._shards.slot_piece(self._key)

  @property
  def handle(self):
    return self.value

  def _direct_assign(self, value):
    self._shards.write_slot_piece(self._key, value)
