"""GPU benchmark: a ResNet-50 (keras.applications, random weights, synthetic 224x224 images) and a
transformer encoder (12 layers, width 768, sequence 512), each trained by plain Keras, by
tfdist's defaults and by a hand-written `strategy.run` loop, under default and mirrored, in
float32, bfloat16 and float16: samples/s, MFU against the device's measured matmul peak, and
the GPU's peak memory against `tfdist estimate`'s estimate.

Written for a GPU machine (ResNet-50 at batch 64 needs ~10 GiB); `--small` runs the same code
on tiny shapes to check it on a CPU (its figures mean nothing). Each run is a fresh process.

  python -m benchmarks.bench_gpu [--models resnet50,encoder] [--strategies default,mirrored]
                                 [--precisions float32,bfloat16,float16] [--small]
"""

import json
import subprocess
import sys
import time

from absl import app, flags

flags.DEFINE_list("models", ["resnet50", "encoder"], "Models to train.")
flags.DEFINE_list("strategies", ["default", "mirrored"], "Strategies.")
flags.DEFINE_list("precisions", ["float32", "bfloat16", "float16"], "Precisions.")
flags.DEFINE_list("contenders", ["keras", "tfdist", "by_hand"], "Who trains.")
flags.DEFINE_integer("steps", 30, "Timed steps per run (after 5 untimed).")
flags.DEFINE_bool("small", False, "Tiny shapes: check the script on a CPU.")
flags.DEFINE_string("run", None, "Internal: one run, as JSON of (model, strategy, precision, "
                    "contender); prints its result as JSON.")
FLAGS = flags.FLAGS
POLICY = {"float32": "float32", "bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}


def shapes():
  if FLAGS.small:
    return {"resnet50": dict(batch=8, image=32), "encoder": dict(batch=4, seq=16, width=32,
                                                                 layers=2, heads=2)}
  return {"resnet50": dict(batch=64, image=224), "encoder": dict(batch=8, seq=512, width=768,
                                                                 layers=12, heads=12)}


def build(model: str):
  """(model, inputs, labels, training FLOPs per example) for `model`."""
  import keras
  import numpy as np
  s = shapes()[model]
  rng = np.random.default_rng(0)
  if model == "resnet50":
    net = keras.applications.ResNet50(weights=None, input_shape=(s["image"], s["image"], 3),
                                      classes=1000)
    x = rng.random((s["batch"] * 4, s["image"], s["image"], 3), dtype=np.float32)
    y = rng.integers(0, 1000, len(x)).astype("int32")
    flops = 3 * 8.2e9 * (s["image"] / 224) ** 2  # Forward 4.1 GMACs at 224x224; backward 2x.
    return net, x, y, flops
  inputs = keras.Input((s["seq"],), dtype="int32")
  h = keras.layers.Embedding(32000, s["width"])(inputs)
  for _ in range(s["layers"]):
    a = keras.layers.MultiHeadAttention(s["heads"], s["width"] // s["heads"])(h, h)
    h = keras.layers.LayerNormalization()(h + a)
    f = keras.layers.Dense(4 * s["width"], activation="gelu")(h)
    h = keras.layers.LayerNormalization()(h + keras.layers.Dense(s["width"])(f))
  outputs = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(h))
  net = keras.Model(inputs, outputs)
  x = rng.integers(0, 32000, (s["batch"] * 4, s["seq"])).astype("int32")
  y = rng.integers(0, 2, len(x)).astype("int32")
  per_layer = 12 * s["width"] ** 2 + 2 * s["seq"] * s["width"]  # Matmul MACs per token.
  flops = 3 * 2 * s["seq"] * s["layers"] * per_layer
  return net, x, y, flops


def one_run(model: str, strategy_name: str, precision: str, contender: str) -> dict:
  import keras
  import numpy as np
  import tensorflow as tf

  import tfdist
  from tfdist.machine import speed
  from tfdist.parallel import estimates

  batch = shapes()[model]["batch"]
  gpus = tf.config.list_logical_devices("GPU")
  replicas = len(gpus) if strategy_name == "mirrored" and gpus else 1
  global_batch = batch * replicas
  steps = FLAGS.steps + 5
  timings = []

  class Timer(keras.callbacks.Callback):
    def on_train_batch_end(self, step, logs=None):
      timings.append(time.perf_counter())

  def compile_args():
    return dict(optimizer=keras.optimizers.Adam(1e-4),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

  def built():
    net, x, y, flops = build(model)
    return net, np.concatenate([x] * (steps // 4 + 2))[:steps * global_batch], \
        np.concatenate([y] * (steps // 4 + 2))[:steps * global_batch], flops

  if contender == "tfdist":
    config = {"strategy": strategy_name, "training": {
        "global_batch_size": global_batch,
        "mixed_precision": "off" if precision == "float32" else precision,
        "steps_per_execution": 1}}  # One step a call: the timer sees every step.
    _, x, y, flops = built()
    history = tfdist.fit(lambda: build(model)[0], x, y, config=config, compile=compile_args,
                         epochs=1, callbacks=[Timer()], verbose=0)
    net = history.model
  else:
    strategy = tf.distribute.MirroredStrategy() if strategy_name == "mirrored" else \
        tf.distribute.get_strategy()
    keras.config.set_dtype_policy(POLICY[precision])
    with strategy.scope():
      net, x, y, flops = built()
      net.compile(**compile_args())
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch).prefetch(2)
    if contender == "keras":
      net.fit(dataset, epochs=1, callbacks=[Timer()], verbose=0)
    else:  # By hand: strategy.run of a GradientTape step, loss scaled by the global batch.
      optimizer = net.optimizer
      loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

      @tf.function
      def step(batch):
        def replica_step(xb, yb):
          with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(yb, net(xb, training=True)),
                                              global_batch_size=global_batch)
            scaled = optimizer.scale_loss(loss)
          optimizer.apply_gradients(zip(tape.gradient(scaled, net.trainable_variables),
                                        net.trainable_variables))
          return loss
        return strategy.reduce("SUM", strategy.run(replica_step, args=batch), axis=None)
      for batch_ in strategy.experimental_distribute_dataset(dataset):
        step(batch_).numpy()
        timings.append(time.perf_counter())
    keras.config.set_dtype_policy("float32")
  seconds = (timings[-1] - timings[4]) / (len(timings) - 5)
  samples = global_batch / seconds
  peak = speed.matmul_peak({"float32": "float32", "bfloat16": "bfloat16",
                            "float16": "float16"}[precision])
  result = {"samples_per_s": samples, "mfu": samples * flops / (replicas * peak.flops),
            "peak": peak.describe()}
  if gpus:
    result["peak_gib"] = tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2 ** 30
    plan = estimates.estimate_memory(net, batch=global_batch, devices=replicas)
    result["plan_gib"] = plan["data_parallel"].total / 2 ** 30
  return result


def main(argv):
  del argv
  if FLAGS.run:
    print("RESULT " + json.dumps(one_run(*json.loads(FLAGS.run))), flush=True)
    return
  rows = ["| model | strategy | precision | contender | samples/s | ratio to Keras | MFU | "
          "peak GiB | plan GiB |", "|---|---|---|---|---|---|---|---|---|"]
  for model in FLAGS.models:
    for strategy in FLAGS.strategies:
      for precision in FLAGS.precisions:
        results = {}
        for contender in FLAGS.contenders:
          argv = [sys.executable, "-m", "benchmarks.bench_gpu", "--run",
                  json.dumps([model, strategy, precision, contender]),
                  f"--steps={FLAGS.steps}"] + (["--small"] if FLAGS.small else [])
          done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
          line = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
          results[contender] = json.loads(line[0][7:]) if line else {
              "error": (done.stderr.strip().splitlines() or ["no output"])[-1][:80]}
        base = results.get("keras", {}).get("samples_per_s")
        for contender, r in results.items():
          if "error" in r:
            rows.append(f"| {model} | {strategy} | {precision} | {contender} | failed: "
                        f"{r['error']} | | | | |")
            continue
          ratio = f"{r['samples_per_s'] / base:.2f}" if base else ""
          rows.append(f"| {model} | {strategy} | {precision} | {contender} | "
                      f"{r['samples_per_s']:,.1f} | {ratio} | {r['mfu']:.3f} | "
                      f"{r.get('peak_gib', float('nan')):.2f} | "
                      f"{r.get('plan_gib', float('nan')):.2f} |")
        print("\n".join(rows[-len(results):]), flush=True)
  print("\n".join(rows))


if __name__ == "__main__":
  app.run(main)
