"""Why `training.fused_optimizer` is on by default: milliseconds per training step of the
benchmark MLP (bfloat16, batch 256) spent in forward + backward, in Keras's own Adam update and
in the fused update tfdist installs. Each part runs 64 times in one tf.function; the table gives
the best of --rounds runs, interleaved.

  python -m benchmarks.bench_optimizer_update [--rounds 5]
"""

import time

from absl import app, flags

from benchmarks import common

flags.DEFINE_integer("rounds", 5, "Interleaved runs of each part.")
FLAGS = flags.FLAGS
BATCH, STEPS = 256, 64


def main(argv):
  del argv
  import keras
  import tensorflow as tf
  from tfdist.training import fused_updates

  keras.config.set_dtype_policy("mixed_bfloat16")
  x, y = (tf.constant(a) for a in common.data(BATCH))
  model = common.model_fn()
  args = common.compile_args()
  variables = model.trainable_variables
  keras_adam, fused_adam = args["optimizer"], keras.optimizers.Adam(1e-3)
  fused_updates.install(fused_adam)
  for optimizer in (keras_adam, fused_adam):
    optimizer.build(variables)
  grads = [tf.fill(v.shape, 1e-3) for v in variables]

  def gradients():
    with tf.GradientTape() as tape:
      loss = args["loss"](y, model(x, training=True))
    return tape.gradient(loss, variables)

  def repeated(step):
    @tf.function
    def run():
      out = step()
      for _ in tf.range(STEPS - 1):
        out = step()  # Carried, so that the graph keeps what computes it.
      return out
    return run

  parts = {
      "forward + backward": repeated(gradients),
      "Keras's Adam update": repeated(lambda: keras_adam.apply(grads, variables) or 0),
      "fused Adam update": repeated(lambda: fused_adam.apply(grads, variables) or 0),
  }
  best = {name: float("inf") for name in parts}
  for run in parts.values():
    run()  # Trace.
  for _ in range(FLAGS.rounds):
    for name, run in parts.items():
      start = time.perf_counter()
      run()
      best[name] = min(best[name], (time.perf_counter() - start) * 1000 / STEPS)
  base = best["Keras's Adam update"]
  print("| part | ms per step (best) | ratio to Keras's Adam update |\n|---|---|---|")
  for name, ms in best.items():
    print(f"| {name} | {ms:.2f} | {ms / base:.2f} |")


if __name__ == "__main__":
  app.run(main)
