"""The issue's user: a causal LM too big for one device generates split over two. A GPT-2-shaped
KerasHub model (random weights) is built in host memory, split over this process's two devices
(the config's: two logical GPUs whose memory limit the model's weights exceed) and generates
greedily; prints `PLAN <stage MiB> ...`, `PEAK <device> <MiB>` per device and `TOKENS <n>`.

    python generate_split.py LAYERS WIDTH      (devices from the config: devices.logical_gpus)
"""

import sys

import keras
import keras_hub
import numpy as np
import tensorflow as tf

import tfdist
from tfdist.parallel import placement, estimates, split

tfdist.make_strategy(tfdist.load_config())  # Sets up the config's devices.
layers, width = int(sys.argv[1]), int(sys.argv[2])
with tf.device("/CPU:0"):  # Host memory: the whole model fits no single device.
  keras.utils.set_random_seed(0)
  backbone = keras_hub.models.GPT2Backbone(
      vocabulary_size=32000, num_layers=layers, num_heads=width // 64, hidden_dim=width,
      intermediate_dim=4 * width, max_sequence_length=256)
  causal_lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
devices = placement.stage_devices_here()
plan = estimates.estimate_generation(causal_lm, batch=4, length=256, devices=len(devices))
print("PLAN", *(f"{m.total / 2 ** 20:.0f}" for m in plan["split"]), flush=True)
split(causal_lm, "balanced", devices=devices)
causal_lm.compile(sampler="greedy")
ids = np.zeros((4, 256), "int32")
ids[:, :8] = np.arange(1, 33).reshape(4, 8)
mask = ids != 0
tokens = causal_lm.generate({"token_ids": ids, "padding_mask": mask},
                            stop_token_ids=None)["token_ids"]
for device in devices:
  name = device.split("device:")[-1]
  print("PEAK", name, f"{tf.config.experimental.get_memory_info(name)['peak'] / 2 ** 20:.0f}")
print("TOKENS", int((tokens != 0).sum()), flush=True)
