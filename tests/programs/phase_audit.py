"""Trains under the environment's config (a launched task) with the tfdist collectives of its
path switched on by the config, and records every collective run outside a compiled call of the
training steps: an eager all-reduce or all-gather, a barrier, or a compiled function that
tfdist's own code calls, each with the phase the task had recorded then (`tfdist.progress`).
Prints `AUDIT <json>`: the ones run in the task's own code (`Phase.OWN`, `Phase.EPOCH_END`),
where the hang watch would take a task waiting for its peers for one its peers wait for;
`CALLS <json>`: how many times each recorded function ran in any phase (so a test knows the
recording saw them); `MARKED <name>` as the task first enters each `tfdist.progress.Collective`.

LOOP=1 trains through `tfdist.TrainingLoop` instead of `tfdist.fit`."""

import functools
import json
import os
import traceback

import tfdist
import tfdist.progress as progress
from tests.programs import equivalence_case as case

TFDIST = os.path.dirname(tfdist.__file__)
seen = []
calls: dict[str, int] = {}
marked: set[str] = set()  # The Collectives' values entered.


def _tfdist_caller() -> str | None:
  """The innermost frame of tfdist's own code calling, as FILE:LINE FUNCTION."""
  for frame in reversed(traceback.extract_stack()[:-2]):
    if frame.filename.startswith(TFDIST) and not frame.filename.endswith("progress.py"):
      return f"{os.path.relpath(frame.filename, TFDIST)}:{frame.lineno} {frame.name}"
  return None


def _recording(kind, function):
  @functools.wraps(function)
  def recorded(*args, **kwargs):
    import tensorflow as tf
    calls[kind] = calls.get(kind, 0) + 1
    phase = progress.snapshot()["phase"]
    if tf.executing_eagerly() and phase in (progress.Phase.OWN.value,
                                            progress.Phase.EPOCH_END.value):
      caller = _tfdist_caller()
      if caller:
        name = getattr(args[0], "_name", "") if kind == "compiled function" else ""
        seen.append({"kind": kind, "name": name, "phase": phase, "caller": caller})
    return function(*args, **kwargs)
  return recorded


def audit():
  from tensorflow.python.eager import context
  from tensorflow.python.eager.polymorphic_function import polymorphic_function
  from tensorflow.python.ops import collective_ops
  for name in ("all_reduce_v2", "all_gather_v2", "all_to_all_v2", "broadcast_send_v2",
               "broadcast_recv_v2"):
    setattr(collective_ops, name, _recording(name, getattr(collective_ops, name)))
  entered = progress._enter  # pylint: disable=protected-access

  def entering(phase, where=""):
    if phase == progress.Phase.COLLECTIVE and where not in marked:  # The exit barrier too.
      marked.add(where)
      print("MARKED " + progress.Collective(where).name, flush=True)
    return entered(phase, where)
  progress._enter = entering  # pylint: disable=protected-access
  context.Context.wait_at_barrier = _recording("barrier", context.Context.wait_at_barrier)
  function_class = polymorphic_function.Function
  function_class.__call__ = _recording("compiled function", function_class.__call__)


def fit(config):
  import keras
  x, y = case.data()
  tfdist.fit(case.model_fn, x, y, config=config, batch_size=case.GLOBAL_BATCH,
             compile=lambda: dict(optimizer=keras.optimizers.Adam(0.01),
                                  loss=keras.losses.SparseCategoricalCrossentropy(
                                      from_logits=True), metrics=["accuracy"]),
             epochs=2, validation_data=(x[:64], y[:64]), verbose=0)


def loop(config):
  import keras
  import tensorflow as tf
  x, y = case.data()
  loop = tfdist.TrainingLoop(config)
  with loop.scope():
    model, optimizer = case.model_fn(), keras.optimizers.SGD(0.1)
  loop.prepare(model, optimizer)
  loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  def step(features, labels):
    with tf.GradientTape() as tape:
      value = loss(labels, model(features, training=True))
    optimizer.apply_gradients(zip(tape.gradient(value, model.trainable_variables),
                                  model.trainable_variables))
    return value
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(case.GLOBAL_BATCH)
  held_out = tf.data.Dataset.from_tensor_slices((x[:64], y[:64])).batch(case.GLOBAL_BATCH)
  for _ in loop.epochs(2):
    for _ in loop.run(step, dataset):
      pass
    # A second dataset after the first calls (through the tf.data service: named anew).
    for _ in loop.run(lambda features, labels: loss(labels, model(features)), held_out):
      pass


if __name__ == "__main__":
  audit()
  (loop if os.environ.get("LOOP") else fit)(tfdist.load_config())
  print("AUDIT " + json.dumps(seen), flush=True)
  print("CALLS " + json.dumps(calls), flush=True)
