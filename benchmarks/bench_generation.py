"""Generation benchmark: a GPT-2-shaped KerasHub causal LM (random weights, built from a config)
generating greedily, in tokens per second: unsplit on one device (plain KerasHub, the
reference), its layers placed over two devices with KerasHub's stacked cache (placement alone),
split by tfdist (each block's cache on its device), and split with the prompts in 2 and 4
micro-batches.

On a CPU the two devices are logical CPUs sharing the same cores: the ratios show the split's
overhead, never a speed-up. On a GPU machine the devices are the first two GPUs, or two logical
GPUs of `--gpu-memory` MiB each cut from one; each device's peak memory is printed beside
`estimates.estimate_generation`'s estimate.

  python -m benchmarks.bench_generation [--layers 8 --hidden 512 --heads 8 --vocab 16384]
                                        [--batch 8 --prompt 16 --length 80] [--gpu-memory MiB]
"""

import time

from absl import app, flags

flags.DEFINE_integer("layers", 8, "Transformer blocks.")
flags.DEFINE_integer("hidden", 512, "Hidden width.")
flags.DEFINE_integer("heads", 8, "Attention heads.")
flags.DEFINE_integer("vocab", 16384, "Vocabulary size.")
flags.DEFINE_integer("batch", 8, "Prompts generated at once.")
flags.DEFINE_integer("prompt", 16, "Tokens in each prompt.")
flags.DEFINE_integer("length", 80, "Sequence length after generation, prompt included.")
flags.DEFINE_integer("repeats", 3, "Timed generate calls per case (after one untimed).")
flags.DEFINE_integer("gpu_memory", None, "On a one-GPU machine: MiB of each of two logical "
                     "GPUs (default: split 90% of the GPU evenly).")
FLAGS = flags.FLAGS


def devices() -> list[str]:
  import tensorflow as tf
  gpus = tf.config.list_physical_devices("GPU")
  if len(gpus) == 1:
    from tfdist.machine import facts
    limit = FLAGS.gpu_memory or int(0.45 * (facts.gpu_memory_mib("0") or 8192))
    tf.config.set_logical_device_configuration(
        gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=limit)] * 2)
  elif not gpus:
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
  kind = "GPU" if gpus else "CPU"
  return [f"/device:{kind}:0", f"/device:{kind}:1"]


def build():
  import keras
  import keras_hub
  keras.utils.set_random_seed(0)
  backbone = keras_hub.models.GPT2Backbone(
      vocabulary_size=FLAGS.vocab, num_layers=FLAGS.layers, num_heads=FLAGS.heads,
      hidden_dim=FLAGS.hidden, intermediate_dim=4 * FLAGS.hidden,
      max_sequence_length=FLAGS.length)
  causal_lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
  causal_lm.compile(sampler="greedy")
  return causal_lm


def timed(causal_lm, inputs) -> tuple[float, object]:
  tokens = causal_lm.generate(inputs, stop_token_ids=None)["token_ids"]  # Compiles.
  start = time.perf_counter()
  for _ in range(FLAGS.repeats):
    causal_lm.generate(inputs, stop_token_ids=None)
  seconds = (time.perf_counter() - start) / FLAGS.repeats
  return FLAGS.batch * (FLAGS.length - FLAGS.prompt) / seconds, tokens


def peaks(names: list[str]) -> str:
  import tensorflow as tf
  if "GPU" not in names[0]:
    return ""
  info = [tf.config.experimental.get_memory_info(d.split("device:")[-1]) for d in names]
  return " | ".join(f"{i['peak'] / 2 ** 20:.0f}" for i in info) + " MiB"


def main(_):
  names = devices()
  import numpy as np
  import tensorflow as tf

  from tfdist.parallel import placement, estimates, split

  rng = np.random.default_rng(0)
  ids = np.zeros((FLAGS.batch, FLAGS.length), "int32")
  ids[:, :FLAGS.prompt] = rng.integers(1, FLAGS.vocab, (FLAGS.batch, FLAGS.prompt))
  mask = np.zeros_like(ids, bool)
  mask[:, :FLAGS.prompt] = True
  inputs = {"token_ids": ids, "padding_mask": mask}

  def reset():
    for d in names:
      if "GPU" in d:
        tf.config.experimental.reset_memory_stats(d.split("device:")[-1])

  def placed_only():  # Layers on their devices; KerasHub's stacked cache left as it is.
    causal_lm = build()
    placement.place(causal_lm, placement.assign(causal_lm, "balanced", names))
    causal_lm.jit_compile = False
    return causal_lm

  model = build()
  plan = estimates.estimate_generation(model, batch=FLAGS.batch, length=FLAGS.length,
                                 devices=len(names))
  cases = [("unsplit, one device", lambda: model),
           ("placed, KerasHub's stacked cache", placed_only),
           ("split by tfdist", lambda: split(build(), "balanced", devices=names)),
           ("split, 2 micro-batches", lambda: split(build(), "balanced", devices=names,
                                                    microbatches=2)),
           ("split, 4 micro-batches", lambda: split(build(), "balanced", devices=names,
                                                    microbatches=4))]
  print(f"GPT-2 shape: {FLAGS.layers} blocks, width {FLAGS.hidden}, vocabulary {FLAGS.vocab} "
        f"({model.count_params() / 1e6:.1f} M parameters); {FLAGS.batch} prompts of "
        f"{FLAGS.prompt} tokens to {FLAGS.length}; devices {', '.join(names)}")
  print("plan, MiB per device (weights + kv cache + activations): one device "
        f"{plan['unsplit'].total / 2 ** 20:.0f}, split "
        + " | ".join(f"{m.total / 2 ** 20:.0f}" for m in plan["split"]))
  print(f"{'case':36}{'tokens/s':>10}{'vs unsplit':>12}{'same tokens':>13}  peak memory")
  reference = expected = None
  for name, make in cases:
    causal_lm = make()
    reset()
    rate, tokens = timed(causal_lm, inputs)
    reference = reference or rate
    expected = tokens if expected is None else expected
    same = bool((np.asarray(tokens) == np.asarray(expected)).all())
    print(f"{name:36}{rate:>10.1f}{rate / reference:>11.2f}x{str(same):>13}  {peaks(names)}",
          flush=True)


if __name__ == "__main__":
  app.run(main)
