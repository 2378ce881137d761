"""tfdist.TrainingLoop against the hand-written `strategy.run` loop of TensorFlow's custom
training tutorial, and against tfdist.fit, on the same model, data, batch and precision
(float32, Keras's own optimizer update everywhere). Target: the loop at one step per call
>= 0.98 of the hand-written loop.

By hand: a `tf.function` running `strategy.run` of a GradientTape step (loss by
`tf.nn.compute_average_loss`) and `strategy.reduce` of the loss, called per batch of the
distributed dataset. The loop: the same step written for one device, at 1 step per call (the
hand-written loop's structure) and at 32. fit: Keras's own train_step through tfdist.fit.
Each run is a fresh process (two MirroredStrategy objects in one process share collective keys).

  python -m benchmarks.bench_custom_loop [--rounds 3] [--strategies default,mirrored]
"""

import subprocess
import sys

from absl import app, flags

from benchmarks import common

flags.DEFINE_integer("rounds", 3, "Interleaved runs of each contender.")
flags.DEFINE_integer("samples", 8192, "Generated training examples.")
flags.DEFINE_integer("epochs", 3, "Epochs per run; the first is not timed.")
flags.DEFINE_list("strategies", ["default", "mirrored"], "Strategies (mirrored: 2 logical "
                  "CPUs, which share the cores: overhead, not speed).")
flags.DEFINE_string("run", None, "Internal: one contender, as CONTENDER:STRATEGY.")
FLAGS = flags.FLAGS
BATCH = 256


def config(strategy, steps=1):
  return {"strategy": strategy, "devices": {"logical_cpus": 2 if strategy == "mirrored" else 0},
          "training": {"global_batch_size": BATCH, "mixed_precision": "off",
                       "steps_per_execution": steps, "fused_optimizer": False}}


def by_hand(x, y, strategy_name):
  import keras
  import tensorflow as tf
  import tfdist
  tfdist.configure_devices(tfdist.load_config(config(strategy_name)).devices)
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) \
      if strategy_name == "mirrored" else tf.distribute.get_strategy()
  with strategy.scope():
    model = common.model_fn()
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
  loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

  def train_step(inputs):
    images, labels = inputs
    with tf.GradientTape() as tape:
      loss = tf.nn.compute_average_loss(loss_object(labels, model(images, training=True)),
                                        global_batch_size=BATCH)
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                  model.trainable_variables))
    return loss

  @tf.function
  def distributed_train_step(inputs):
    return strategy.reduce("SUM", strategy.run(train_step, args=(inputs,)), axis=None)

  dataset = strategy.experimental_distribute_dataset(
      tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True).prefetch(2))
  return _timed(lambda: [float(distributed_train_step(batch)) for batch in dataset][-1])


def with_loop(x, y, strategy_name, steps):
  import keras
  import tensorflow as tf
  import tfdist
  loop = tfdist.TrainingLoop(config(strategy_name, steps))
  with loop.scope():
    model = common.model_fn()
    optimizer = keras.optimizers.Adam(1e-3)
  loop.prepare(model, optimizer)
  loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  def train_step(images, labels):
    with tf.GradientTape() as tape:
      loss = loss_fn(labels, model(images, training=True))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                  model.trainable_variables))
    return {"loss": loss}

  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True) \
      .prefetch(2)
  return _timed(lambda: [float(logs["loss"]) for logs in loop.run(train_step, dataset)][-1])


def with_fit(x, y, strategy_name):
  import tfdist
  timer = common.EpochTimer()
  tfdist.fit(common.model_fn, x, y, config=config(strategy_name, 32), shuffle=False,
             compile=common.compile_args, epochs=FLAGS.epochs, callbacks=[timer], verbose=0)
  return len(x) / min(timer.seconds)


def _timed(epoch) -> float:
  import time
  best = float("inf")
  for index in range(FLAGS.epochs):
    start = time.perf_counter()
    epoch()
    if index:  # The first traces and warms up.
      best = min(best, time.perf_counter() - start)
  return (FLAGS.samples // BATCH * BATCH) / best


def run_in_process(contender: str, strategy: str) -> float:
  argv = [sys.executable, "-m", "benchmarks.bench_custom_loop", f"--run={contender}:{strategy}",
          f"--samples={FLAGS.samples}", f"--epochs={FLAGS.epochs}"]
  out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=900).stdout
  return float(out.split()[-1])


CONTENDERS = {
    "by hand (strategy.run, 1 step/call)": "by_hand",
    "TrainingLoop, 1 step/call": "loop1",
    "TrainingLoop, 32 steps/call": "loop32",
    "tfdist.fit, 32 steps/call": "fit",
}


def main(argv):
  del argv
  if FLAGS.run:
    contender, strategy = FLAGS.run.split(":")
    x, y = common.data(FLAGS.samples)
    run = {"by_hand": lambda: by_hand(x, y, strategy),
           "loop1": lambda: with_loop(x, y, strategy, 1),
           "loop32": lambda: with_loop(x, y, strategy, 32),
           "fit": lambda: with_fit(x, y, strategy)}[contender]
    print(run())
    return
  for strategy in FLAGS.strategies:
    results = common.interleave({name: (lambda c=c: run_in_process(c, strategy))
                                 for name, c in CONTENDERS.items()}, FLAGS.rounds)
    print(f"\n{strategy}\n" + common.table(results, next(iter(CONTENDERS))), flush=True)


if __name__ == "__main__":
  app.run(main)
