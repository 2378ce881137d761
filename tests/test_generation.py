"""A KerasHub GPT-2 causal LM (random weights, built from a config) split over 2 logical CPUs:
the backbone opened down to its blocks, greedy `generate` token for token equal to the unsplit
model's, each block's key/value cache on the block's device, and `tfdist estimate --generate`
saying that a model that does not fit one device fits two."""

import sys

import keras
import keras_hub
import numpy as np
import pytest

from tests.launching import ENV
from tfdist.parallel import placement, split
from tfdist.testing import forked

pytestmark = pytest.mark.usefixtures("two_cpus")
DEVICES = ["/device:CPU:0", "/device:CPU:1"]
CPU0, CPU1 = "/job:localhost/replica:0/task:0/device:CPU:0", \
    "/job:localhost/replica:0/task:0/device:CPU:1"


def gpt2(sampler="greedy", layers=4):
  keras.utils.set_random_seed(0)
  backbone = keras_hub.models.GPT2Backbone(
      vocabulary_size=1000, num_layers=layers, num_heads=4, hidden_dim=64, intermediate_dim=128,
      max_sequence_length=64)
  causal_lm = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
  causal_lm.compile(sampler=sampler)
  return causal_lm


def prompts(lengths=(3, 5, 4, 6, 2), length=20):
  """Token ids of prompts of several lengths, padded to `length`, as `generate` takes them
  without a preprocessor."""
  rng = np.random.default_rng(1)
  ids, mask = np.zeros((len(lengths), length), "int32"), np.zeros((len(lengths), length), bool)
  for row, n in enumerate(lengths):
    ids[row, :n], mask[row, :n] = rng.integers(1, 1000, n), True
  return {"token_ids": ids, "padding_mask": mask}


@pytest.mark.parametrize("sampler,microbatches", [("greedy", 1), ("greedy", 3), ("beam", 1)])
def test_a_split_gpt2_generates_the_unsplit_models_tokens(sampler, microbatches):
  inputs = prompts()
  expected = gpt2(sampler).generate(inputs, stop_token_ids=None)["token_ids"]
  causal_lm = split(gpt2(sampler), "balanced", devices=DEVICES, microbatches=microbatches)
  generated = causal_lm.generate(inputs, stop_token_ids=None)["token_ids"]
  assert (generated[:, :6] != 0).all() and len(np.unique(generated[:, 6:])) > 5
  np.testing.assert_array_equal(generated, expected)
  # The blocks are split: each device holds some of them.
  devices = {block.name: block.weights[0].value.device
             for block in causal_lm.backbone.transformer_layers}
  assert set(devices.values()) == {CPU0, CPU1}, devices


def test_balanced_opens_the_backbone_down_to_its_blocks_and_keeps_the_tied_head_once():
  causal_lm = gpt2(layers=6)
  units = placement.units(causal_lm)
  blocks = [f"transformer_layer_{i}" for i in range(6)]
  assert [name for name in units if name.startswith("transformer_layer")] == blocks
  assert list(units).count("token_embedding") == 1  # The head is the tied token embedding.
  assignment = placement.assign(causal_lm, "balanced", DEVICES)
  sizes = {device: 0 for device in DEVICES}
  for name, layer in units.items():
    sizes[assignment[name]] += layer.count_params()
  assert sum(sizes.values()) == causal_lm.count_params()
  block = units["transformer_layer_0"].count_params()
  assert abs(sizes[DEVICES[0]] - sizes[DEVICES[1]]) <= block, sizes  # Even, by whole blocks.
  assert [assignment[name] for name in blocks].count(DEVICES[1]) >= 3
  # A nested model's name stands for all its units in a list of stages.
  stages = placement.assign(causal_lm, [["padding_mask", "token_ids"], [causal_lm.backbone.name]],
                            DEVICES)
  assert {stages[name] for name in blocks} == {DEVICES[1]}


def test_each_blocks_cache_lives_on_the_blocks_device_and_is_freed_after_generate():
  causal_lm = split(gpt2(), "balanced", devices=DEVICES)
  inputs = prompts()
  caches = causal_lm.tfdist_caches
  _, orders = causal_lm._build_cache(inputs["token_ids"])  # Eagerly: the seed of a generate.
  assert all(order.shape == () for order in orders)  # The loop carries order scalars only.
  variables = caches.variables()
  blocks = causal_lm.backbone.transformer_layers
  assert [v.device for v in variables] == [b.weights[0].value.device for b in blocks]
  assert {v.numpy().shape for v in variables} == {(5, 2, 20, 4, 16)}
  causal_lm.generate(inputs, stop_token_ids=None)
  assert {v.numpy().shape for v in variables} == {(0,)}


def test_a_jit_compile_asked_for_after_the_split_is_turned_off_with_a_notice(capsys):
  causal_lm = split(gpt2(), "balanced", devices=DEVICES)
  causal_lm.compile(sampler="greedy", jit_compile=True)
  assert causal_lm.jit_compile is False
  assert "tfdist: jit_compile=True turned off: the model is split over devices" in \
      capsys.readouterr().out


MODELS = """
import keras, keras_hub

def sized():  # 7.6 M parameters: 29 MiB of float32 weights.
  keras.utils.set_random_seed(0)
  backbone = keras_hub.models.GPT2Backbone(vocabulary_size=5000, num_layers=8, num_heads=4,
      hidden_dim=256, intermediate_dim=1024, max_sequence_length=128)
  return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)

def mlp():
  return keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
"""


def plan(tmp_path, *flags):
  (tmp_path / "models.py").write_text(MODELS)
  (tmp_path / "config.yaml").write_text("devices: {logical_cpus: 2}\n"
                                        "parallel: {stages: balanced}\n")
  return forked.run([sys.executable, "-m", "tfdist", "estimate", "config.yaml", *flags],
                    cwd=tmp_path, env=ENV, timeout=120)


def test_estimate_says_the_model_does_not_fit_one_device_but_fits_two_and_the_split_agrees(
    tmp_path):
  done = plan(tmp_path, "--model", "models:sized", "--generate", "128", "--batch", "4",
              "--memory", "24MiB")
  assert done.returncode == 0, done.stderr[-2000:]
  lines = done.stdout.splitlines()
  assert lines[0].startswith("GPT2CausalLM of 7,6") and "generating 4 sequence(s) of 128 " \
      "tokens, 2 device(s): CPU:0, CPU:1" in lines[0], lines[0]
  assert lines[1] == "each device: 24.00 MiB (--memory)"
  assert lines[-1].startswith("does not fit one device (38.11 MiB > 24.00 MiB); fits 2 split "
                              "(largest stage 21.07 MiB)"), lines[-1]
  table = {line[:24].strip(): [float(v) for v in line[24:].split()[::2]]
           for line in lines[3:6]}  # weights, kv cache, activations, total (MiB)

  # The split's weights and caches, measured on each device, against the plan's.
  import importlib.util
  spec = importlib.util.spec_from_file_location("models", tmp_path / "models.py")
  models = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(models)
  causal_lm = split(models.sized(), "balanced", devices=DEVICES)
  causal_lm._build_cache(np.zeros((4, 128), "int32"))
  weights, caches = {CPU0: 0, CPU1: 0}, {CPU0: 0, CPU1: 0}
  for variable in causal_lm.weights:
    weights[variable.value.device] += int(np.prod(variable.shape)) * 4
  for variable in causal_lm.tfdist_caches.variables():
    caches[variable.device] += variable.numpy().nbytes
  for stage, device in enumerate((CPU0, CPU1)):
    planned = table[f"split, stage {stage}"]
    assert planned[0] == pytest.approx(weights[device] / 2 ** 20, abs=0.01)
    assert planned[1] == pytest.approx(caches[device] / 2 ** 20, abs=0.01)
  one = table["one device"]
  assert one[0] == pytest.approx(sum(weights.values()) / 2 ** 20, abs=0.01)
  assert max(table["split, stage 0"][3], table["split, stage 1"][3]) <= 24 < one[3]


@pytest.mark.parametrize("flags,line", [
    (["--model", "models:mlp", "--generate", "16"],
     "tfdist estimate: --generate: plans generation with a causal LM (KerasHub's CausalLM: "
     "call_with_cache over backbone.transformer_layers); models:mlp returns a Sequential. "
     "Received: 16"),
    (["--model", "models:mlp", "--batch", "8", "--memory", "lots"],
     "tfdist estimate: --memory: must be a size such as 16GiB, 512MiB or a number of bytes. "
     "Received: 'lots'"),
])
def test_estimate_refusals_name_the_flag(tmp_path, flags, line):
  done = plan(tmp_path, *flags)
  assert done.returncode == 2 and done.stderr.strip().splitlines()[-1] == line, done.stderr


def test_the_docs_answer_runs_as_written(capsys):
  """The docs' ten lines, with the preset swapped for a small GPT-2 with a tokenizer (no
  download here) and the GPUs for the two logical CPUs."""
  from tests import docs_blocks
  code = docs_blocks.named("generation").code
  preset = 'keras_hub.models.GPT2CausalLM.from_preset("gpt2_large_en")'
  gpus = '["/GPU:0", "/GPU:1"]'
  assert preset in code and gpus in code and len(code.splitlines()) <= 10
  letters = sorted(set("The first half of the network") - {" "})
  tokens = ["Ġ", *letters, *(f"Ġ{c}" for c in letters)]
  tokens += [f"w{i}" for i in range(999 - len(tokens))] + ["<|endoftext|>"]  # 1000 ids.
  tokenizer = keras_hub.models.GPT2Tokenizer(
      vocabulary={token: i for i, token in enumerate(tokens)},
      merges=[f"Ġ {c}" for c in letters])
  causal_lm = gpt2()
  causal_lm.preprocessor = keras_hub.models.GPT2CausalLMPreprocessor(tokenizer,
                                                                     sequence_length=8)
  exec(code.replace(preset, "small").replace(gpus, str(DEVICES)), {"small": causal_lm})
  printed = capsys.readouterr().out
  assert printed.startswith("['The first half of the networkw") and len(printed) > 60, printed
