"""Generation with a KerasHub causal LM split over devices: each block's key/value cache stays
on the block's device, and the prompts can go in micro-batches.

KerasHub's `CausalLM.generate` runs `call_with_cache` once per new token inside a compiled
sampling loop, with the key/value cache of every transformer block stacked in one tensor
([batch, blocks, 2, length, heads, head size]) that the loop carries. A tensor lives on one
device, and TensorFlow keeps a loop's variables on the loop's device: split over two devices,
the first would hold the whole cache and copy the second's blocks' part over and back at every
token. Here each block's cache is a variable on the block's device, read and written there;
the loop carries one scalar per block that orders each token's write before the next token's
read. KerasHub's own `call_with_cache` still runs (any causal LM written as KerasHub writes
them works: block i reads `cache[:, i, ...]` and returns its new cache); the stacked tensor it
returns is not used, and TensorFlow prunes it from the compiled function. Samplers that change
the cache themselves (beam, contrastive) get one tensor per block, on its block's device between
tokens; the loop still carries those.

With micro-batches the prompts are generated in groups, each its own sampling loop (and its own
cache variables) in one compiled function, so one group's token can be in the second stage
while the next group's is in the first.

```python
prepare(causal_lm, assignment, microbatches=2)  # `split` does this for a causal LM
causal_lm.generate({"token_ids": ids, "padding_mask": mask}, stop_token_ids=None)
```
"""

from __future__ import annotations

import contextlib
import functools
from typing import Mapping

import numpy as np
import tensorflow as tf

from tfdist.errors import UnsupportedError
from tfdist.parallel import pipeline, placement


def is_causal_lm(model) -> bool:
  """Whether `model` generates as KerasHub's causal LMs do (`call_with_cache` over
  `backbone.transformer_layers`, seeded by `_build_cache`)."""
  return (all(callable(getattr(model, name, None))
              for name in ("call_with_cache", "_build_cache", "generate_step"))
          and hasattr(getattr(model, "backbone", None), "transformer_layers"))


def block_devices(model, assignment: Mapping[str, str]) -> list[str]:
  """The device of each of `model.backbone.transformer_layers`, in order."""
  names = {id(layer): name for name, layer in placement.units(model).items()}
  return [assignment[names[id(block)]] for block in model.backbone.transformer_layers]


def prepare(model, assignment: Mapping[str, str], microbatches: int = 1) -> None:
  """Makes the placed causal LM `model` keep each block's cache on the block's device and
  generate its prompts in `microbatches` groups; a generate function compiled before the split
  is dropped.

  Args:
    model: a KerasHub causal LM whose units `placement.place` has put on their devices.
    assignment: {unit name: device}, as `placement.assign` returns it.
    microbatches: groups the prompts of one `generate` call are split into.
  """
  caches = BlockCaches(block_devices(model, assignment), model.compute_dtype)
  model.tfdist_caches = caches
  for block in model.backbone.transformer_layers:
    block.call = _recording(block.call, caches.new)
  build_cache, call_with_cache = model._build_cache, model.call_with_cache

  @functools.wraps(build_cache)
  def build_cache_per_block(*args, **kwargs):
    with caches.seeding(keep_in_variables=_leaves_cache_alone(model.sampler)):
      return build_cache(*args, **kwargs)

  @functools.wraps(call_with_cache)
  def call_with_cache_per_block(token_ids, cache, cache_update_index):
    per_block = caches.read(cache)
    caches.new.clear()
    logits, hidden_states, _ = call_with_cache(token_ids, _ByBlock(per_block),
                                               cache_update_index)
    if len(caches.new) != len(caches.devices):
      raise UnsupportedError(f"a split causal LM's call_with_cache must call each of its "
                             f"{len(caches.devices)} transformer blocks once with a cache; "
                             f"{len(caches.new)} were. Received: {type(model).__name__}")
    return logits, hidden_states, caches.write(cache)

  model._build_cache = build_cache_per_block
  model.call_with_cache = call_with_cache_per_block
  model.generate_step = functools.partial(generate_step, model.generate_step, caches,
                                          microbatches=microbatches)
  model.generate_function = None  # Compiled before the split, it would stack the cache.


class BlockCaches:
  """The key/value caches of a split causal LM's blocks while it generates: in variables on
  each block's device (one set per group of prompts), or as one tensor per block.

  Trace-time state (which group, whether the cache is being seeded) is plain Python: a
  sampling loop is traced once, in order, inside one `generate_step`.
  """

  def __init__(self, devices: list[str], dtype):
    self.devices, self.dtype = devices, tf.as_dtype(dtype)
    self.new: list = []  # Each block's new cache, in call order, while call_with_cache runs.
    self.group = 0
    self._seeding: bool | None = None  # While seeding: whether the cache goes to variables.
    self._variables: dict[int, list[tf.Variable]] = {}
    self._shapes: dict[int, list[tf.TensorShape]] = {}

  def seeding(self, keep_in_variables: bool):
    """While `_build_cache` seeds the cache: whether it goes to variables."""
    return self._while("_seeding", keep_in_variables)

  def for_group(self, group: int):
    """While one group of prompts' sampling loop is traced."""
    return self._while("group", group)

  @contextlib.contextmanager
  def _while(self, attribute: str, value):
    previous = getattr(self, attribute)
    setattr(self, attribute, value)
    try:
      yield
    finally:
      setattr(self, attribute, previous)

  def variables(self) -> list[tf.Variable]:
    """This group's variables, one per block on its device (made once, empty between calls:
    their shape is set by each seed)."""
    if self.group not in self._variables:
      with tf.init_scope():
        made = []
        for device in self.devices:
          with tf.device(device):
            made.append(tf.Variable(tf.zeros([0], self.dtype), shape=tf.TensorShape(None),
                                    trainable=False, name="tfdist_kv_cache"))
        self._variables[self.group] = made
    return self._variables[self.group]

  def read(self, cache) -> tuple:
    """Each block's cache from what the loop carries: a stacked tensor (the seed's zeros, or a
    caller's own cache), one tensor per block, or one order scalar per block."""
    if not isinstance(cache, tuple):
      parts = split_cache(cache, self.devices, zeros=self._seeding is not None)
      if self._seeding:
        self._shapes[self.group] = [part.shape for part in parts]
      return parts
    if cache[0].shape.rank:  # One tensor per block.
      return cache
    reads = []
    for variable, order, shape, device in zip(self.variables(), cache,
                                              self._shapes[self.group], self.devices):
      with tf.device(device), tf.control_dependencies([order]):  # After the last write.
        reads.append(tf.ensure_shape(variable.read_value(), shape))
    return tuple(reads)

  def write(self, cache) -> tuple:
    """What the loop carries on: per block, an order scalar after writing its new cache to its
    variable, or the new cache itself."""
    new, self.new[:] = tuple(self.new), []
    keep = self._seeding if self._seeding is not None else (
        isinstance(cache, tuple) and not cache[0].shape.rank)
    if not keep:
      return new
    orders = []
    for variable, tensor, device in zip(self.variables(), new, self.devices):
      with tf.device(device):
        written = variable.assign(tensor, read_value=False)
        with tf.control_dependencies([written]):
          orders.append(tf.constant(0))
    return tuple(orders)

  def release(self) -> None:
    """Empties every variable (the caches stay allocated no longer than one generate)."""
    for variables in self._variables.values():
      for variable in variables:
        variable.assign(tf.zeros([0], self.dtype), read_value=False)


def split_cache(stacked, devices: list[str], zeros: bool = False) -> tuple:
  """One cache per block on its device from a stacked [batch, blocks, ...] cache; with `zeros`,
  new zeros of each block's shape (where the shape is known when traced, as `generate` traces
  it, the stacked seed is never read, and the compiled function never makes it)."""
  static = stacked.shape
  if zeros and all(d is not None for d in static[2:]):
    shape = [tf.shape(stacked)[0] if static[0] is None else static[0], *static[2:]]
  elif zeros:
    shape = tf.concat([tf.shape(stacked)[:1], tf.shape(stacked)[2:]], 0)
  caches = []
  for i, device in enumerate(devices):
    part = None if zeros else stacked[:, i]  # Sliced where the stacked cache is.
    with tf.device(device):
      caches.append(tf.zeros(shape, stacked.dtype) if zeros else tf.identity(part))
  return tuple(caches)


def generate_step(generate, caches: BlockCaches, inputs, stop_token_ids=None, *,
                  microbatches: int = 1, **kwargs):
  """KerasHub's `generate_step` (`generate`) run on `microbatches` groups of the prompts, one
  sampling loop each in one graph, and the groups' tokens put back together in order; the
  cache variables are emptied after."""
  batch = tf.nest.flatten(inputs)[0].shape[0]
  parts = microbatches if batch is None else max(1, min(microbatches, batch))
  groups = [inputs] if parts == 1 else pipeline.split_batch(inputs, parts)[0]
  outputs = []
  for g, group in enumerate(groups):
    with caches.for_group(g):
      outputs.append(generate(group, stop_token_ids=stop_token_ids, **kwargs))
  caches.release()
  return outputs[0] if parts == 1 else tf.nest.map_structure(lambda *p: tf.concat(p, 0),
                                                             *outputs)


def cache_bytes(model, batch: int, length: int) -> list[int]:
  """Bytes of each transformer block's key/value cache for `batch` sequences of `length`
  tokens, read from the cache KerasHub's `_build_cache` makes (traced, not run) on the model
  before it is split."""
  traced = tf.function(model._build_cache).get_concrete_function(
      tf.TensorSpec([batch, length], tf.int32))
  cache = traced.structured_outputs[1]
  blocks = cache.shape[1]
  return [int(np.prod(cache.shape)) * cache.dtype.size // blocks] * blocks


def _leaves_cache_alone(sampler) -> bool:
  """Whether `sampler`'s loop only passes the cache on (KerasHub's greedy, top-k, top-p and
  random samplers), so it may stay in variables; beam and contrastive change it."""
  from keras_hub.samplers import Sampler
  return type(sampler).__call__ is Sampler.__call__


class _ByBlock:
  """The per-block caches, read as KerasHub reads its stacked cache: `cache[:, i, ...]`."""

  def __init__(self, caches: tuple):
    self.caches = caches

  def __getitem__(self, key):
    if (isinstance(key, tuple) and len(key) >= 2 and key[0] == slice(None)
        and isinstance(key[1], int) and all(k is Ellipsis for k in key[2:])):
      return self.caches[key[1]]
    raise UnsupportedError("a split causal LM keeps one cache per block: its call_with_cache "
                           f"may read cache[:, i, ...] alone. Received: cache[{key!r}]")


def _recording(call, new_caches: list):
  """`call` of a transformer block, keeping the new cache it returns when given a cache."""
  @functools.wraps(call)
  def call_recording(*args, **kwargs):
    outputs = call(*args, **kwargs)
    if kwargs.get("self_attention_cache") is not None:
      new_caches.append(outputs[1])
    return outputs
  return call_recording
