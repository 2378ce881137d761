"""`tfdist estimate`'s training memory against a measured step, for a family of models: MLP,
CNN, LSTM and GRU over long sequences, a transformer encoder, an Embedding model, a model
nested in another, KerasHub's GPT-2 (a small one, built here: no download).

Measured: TensorFlow's own allocator statistics (`tf.config.experimental.get_memory_info`,
with TF_CPU_ALLOCATOR_USE_BFC=true so the CPU allocator keeps them): the peak bytes of live
tensors during a training step (`train_on_batch`, after one that built and traced it; the
median of 3 steps, one op at a time), the model's variables and the optimizer's slots
included. That is what `estimate` counts, on CPU
as on a GPU (where the same call reads the GPU's allocator); the process's peak RSS would add
Python, the traced graphs and the libraries, and the profiler's memory view needs a trace per
step. Each model runs in a process of its own. Target: the estimate within 1.5x of the
measured peak. The estimate before this change (each layer's output only) is shown beside it.

  python -m benchmarks.bench_memory_estimate [--models lstm,gru] [--long]
"""

import json
import os
import subprocess
import sys

from absl import app, flags

flags.DEFINE_list("models", None, "Models to measure (default: all).")
flags.DEFINE_string("one", None, "Measure this model in this process and print JSON.")
flags.DEFINE_bool("long", False, "Also the issue's LSTM over 20,000 steps at batch 64 (slow).")
FLAGS = flags.FLAGS
MIB = 2 ** 20


def _compiled(model, loss):
  import keras
  model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss, jit_compile=False)
  return model


def mlp():
  import keras
  model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(1024, activation="relu"),
                            keras.layers.Dense(1024, activation="relu"), keras.layers.Dense(10)])
  return _compiled(model, keras.losses.SparseCategoricalCrossentropy(from_logits=True)), 256


def cnn():
  import keras
  model = keras.Sequential([
      keras.Input((64, 64, 3)), keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
      keras.layers.Conv2D(64, 3, padding="same", activation="relu"), keras.layers.MaxPool2D(),
      keras.layers.Conv2D(64, 3, padding="same", activation="relu"),
      keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(10)])
  return _compiled(model, keras.losses.SparseCategoricalCrossentropy(from_logits=True)), 64


def _recurrent(layer, steps):
  import keras
  inputs = keras.Input((steps, 8))
  x = keras.layers.Conv1D(32, 5, padding="same", activation="relu")(inputs)
  x = layer(64)(x)
  return _compiled(keras.Model(inputs, keras.layers.Dense(1)(x)), "mse")


def lstm():
  import keras
  return _recurrent(keras.layers.LSTM, 3000), 32


def gru():
  import keras
  return _recurrent(keras.layers.GRU, 3000), 32


def lstm_20000():
  import keras
  return _recurrent(keras.layers.LSTM, 20000), 64


def transformer():
  import keras
  inputs = keras.Input((512, 64))
  attended = keras.layers.MultiHeadAttention(num_heads=4, key_dim=16)(inputs, inputs)
  x = keras.layers.LayerNormalization()(inputs + attended)
  x = keras.layers.LayerNormalization()(x + keras.layers.Dense(64)(
      keras.layers.Dense(256, activation="gelu")(x)))
  outputs = keras.layers.Dense(2)(keras.layers.GlobalAveragePooling1D()(x))
  model = keras.Model(inputs, outputs)
  return _compiled(model, keras.losses.SparseCategoricalCrossentropy(from_logits=True)), 16


def embedding():
  import keras
  model = keras.Sequential([keras.Input((200,), dtype="int32"),
                            keras.layers.Embedding(20000, 128),
                            keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
  return _compiled(model, keras.losses.BinaryCrossentropy(from_logits=True)), 256


def nested():
  import keras
  block = keras.Sequential([keras.Input((512,)), keras.layers.Dense(2048, activation="relu"),
                            keras.layers.Dense(512)], name="block")
  inputs = keras.Input((512,))
  model = keras.Model(inputs, keras.layers.Dense(10)(block(inputs)))
  return _compiled(model, keras.losses.SparseCategoricalCrossentropy(from_logits=True)), 512


def gpt2():
  import keras
  import keras_hub
  backbone = keras_hub.models.GPT2Backbone(vocabulary_size=5000, num_layers=4, num_heads=4,
                                           hidden_dim=128, intermediate_dim=512,
                                           max_sequence_length=256)
  model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
  return _compiled(model, keras.losses.SparseCategoricalCrossentropy(from_logits=True)), 8


MODELS = {f.__name__: f for f in (mlp, cnn, lstm, gru, transformer, embedding, nested, gpt2)}
LENGTH = {"gpt2": 256}  # GPT-2's inputs leave the sequence length open.


def _batch_of(model, batch, length):
  """Random inputs and targets of the model's own symbolic shapes, an open dimension at
  `length` (integers: 0 or 1; a sparse loss's targets: class ids, one dimension fewer)."""
  import numpy as np
  from keras import tree
  rng = np.random.default_rng(0)

  def value(shape, dtype):
    if dtype == "bool" or np.issubdtype(np.dtype(dtype), np.integer):
      return rng.integers(0, 2, shape).astype(dtype)
    return rng.random(shape, dtype=np.float32)

  def dims(tensor):
    return [batch] + [length if d is None else d for d in tensor.shape[1:]]

  def symbolic(name):  # A Sequential never called has its `inputs` list, not `input`.
    try:
      return getattr(model, name)
    except AttributeError:
      found = getattr(model, name + "s")
      return found[0] if len(found) == 1 else found

  x = tree.map_structure(lambda t: value(dims(t), t.dtype), symbolic("input"))
  losses = model.loss if isinstance(model.loss, (list, tuple)) else [model.loss]
  targets = []
  for i, output in enumerate(tree.flatten(symbolic("output"))):
    loss = losses[min(i, len(losses) - 1)]
    if "sparse" in (loss if isinstance(loss, str) else type(loss).__name__).lower():
      targets.append(value(dims(output)[:-1], "int32"))
    else:
      targets.append(value(dims(output), "float32"))
  return x, targets[0] if len(targets) == 1 else targets


def measure(name: str) -> dict:
  import tensorflow as tf
  from tfdist.parallel import estimates

  # One op at a time, as a GPU's stream runs its kernels: with several inter-op threads a CPU
  # runs independent ops at once and the same step's peak varied by up to 1.3x.
  tf.config.threading.set_inter_op_parallelism_threads(1)
  # Each op's threads: the cores this process may use (the default pool can count others).
  tf.config.threading.set_intra_op_parallelism_threads(len(os.sched_getaffinity(0)))
  # One region reserved up front, as a GPU's allocator reserves its memory: growing region by
  # region, the allocator hands tensors whole free chunks of up to twice their size.
  tf.zeros([1 << 28], tf.float32)  # 1 GiB, freed at once: one free chunk to split.

  model, batch = {**MODELS, "lstm_20000": lstm_20000}[name]()
  length = LENGTH.get(name)
  plan = estimates.estimate_memory(model, batch=batch, devices=1, length=length)
  plan = plan["data_parallel"]
  outputs_only = sum(r["activations"] for r in estimates.output_bytes(model, batch, length or 1))
  x, y = _batch_of(model, batch, length)
  model.train_on_batch(x, y)  # Builds the optimizer, traces the step.
  peaks = []
  for _ in range(3):  # The median of 3 steps' peaks.
    tf.config.experimental.reset_memory_stats("CPU:0")
    model.train_on_batch(x, y)
    peaks.append(tf.config.experimental.get_memory_info("CPU:0")["peak"])
  peak = sorted(peaks)[1]
  return {"model": name, "batch": batch, "estimate": plan.total,
          "activations": plan.activations, "working": plan.working,
          "before": plan.total - plan.activations - plan.working + outputs_only,
          "measured": peak}


def main(argv):
  del argv
  if FLAGS.one:
    print("RESULT " + json.dumps(measure(FLAGS.one)), flush=True)
    return
  names = FLAGS.models or list(MODELS) + (["lstm_20000"] if FLAGS.long else [])
  env = {**os.environ, "TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_CPP_MIN_LOG_LEVEL": "2",
         "CUDA_VISIBLE_DEVICES": ""}
  print(f"{'model':12}{'batch':>6}{'measured':>12}{'estimate':>12}{'ratio':>7}"
        f"{'layer outputs only':>20}{'ratio':>7}")
  for name in names:
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench_memory_estimate",
                           f"--one={name}"], env=env, capture_output=True, text=True,
                          timeout=1800)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
      print(f"{name:12} failed: {done.stderr.strip().splitlines()[-1:]}")
      continue
    r = json.loads(lines[0][len("RESULT "):])
    print(f"{name:12}{r['batch']:>6}{r['measured'] / MIB:>9.1f} MiB{r['estimate'] / MIB:>8.1f} MiB"
          f"{r['estimate'] / r['measured']:>6.2f}x{r['before'] / MIB:>16.1f} MiB"
          f"{r['before'] / r['measured']:>6.2f}x", flush=True)


if __name__ == "__main__":
  app.run(main)
