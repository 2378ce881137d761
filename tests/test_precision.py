"""`training.mixed_precision`: which policy each mode means on which machine, and what a model
built by tfdist.fit under it computes in."""

import keras
import numpy as np
import pytest

import tfdist
from tfdist.machine import facts, speed
from tfdist.machine import precision
from tests.programs import equivalence_case as case

pytestmark = pytest.mark.usefixtures("two_cpus")  # TensorFlow starts with the suite's devices.


@pytest.mark.parametrize("flags,gpus,half", [
    ({"avx512f", "amx_bf16"}, [], "bfloat16"),
    ({"avx512f", "avx512_bf16"}, [], "bfloat16"),
    ({"avx512f", "avx2"}, [], None),
    (set(), [(8, 0), (9, 0)], "bfloat16"),
    ({"avx512_bf16"}, [(7, 5)], "float16"),  # The GPUs decide, the oldest one.
    (set(), [(8, 6), (7, 0)], "float16"),
    (set(), [(6, 1)], None),
])
def test_the_half_type_worth_measuring_on_each_machine(flags, gpus, half):
  assert precision.half_candidate(flags, gpus) == half


def test_float16_is_left_out_where_loss_scaling_fails():
  assert precision.half_candidate(set(), [(7, 5)], loss_scaling=False) is None
  assert precision.half_candidate(set(), [(8, 0)], loss_scaling=False) == "bfloat16"


@pytest.mark.parametrize("mode,half,speedup,policy", [
    ("off", "bfloat16", 3.0, "float32"),
    ("bfloat16", None, None, "mixed_bfloat16"),
    ("float16", None, 0.5, "mixed_float16"),
    ("auto", "bfloat16", 1.68, "mixed_bfloat16"),
    ("auto", "bfloat16", 0.6, "float32"),  # AVX-512 BF16 without AMX, measured slower.
    ("auto", "bfloat16", 1.05, "float32"),  # Within noise: exactness wins.
    ("auto", "float16", 2.0, "mixed_float16"),
    ("auto", None, None, "float32"),
])
def test_policy_for_each_mode_and_measurement(mode, half, speedup, policy):
  assert precision.choose_policy(mode, half, speedup) == policy


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16\n\n"
                     "processor\t: 1\nflags\t\t: fpu amx_bf16\n")
  assert facts.cpu_flags(cpuinfo) == {"fpu", "avx512f", "avx512_bf16", "amx_bf16"}
  assert facts.cpu_flags(tmp_path / "missing") == set()


@pytest.fixture
def bf16_cpu(monkeypatch, tmp_path):
  """A CPU with AVX-512 BF16 and an empty cache of measurements in `tmp_path`."""
  monkeypatch.setattr(facts, "cpu_flags", lambda *_: {"avx512_bf16"})
  monkeypatch.setattr(facts, "gpu_capabilities", lambda: [])
  monkeypatch.setenv(speed.CACHE_ENV, str(tmp_path))
  monkeypatch.setattr(speed, "_MEMO", {})


def test_auto_measures_once_per_machine_and_caches(bf16_cpu, monkeypatch):
  calls = []

  def measure(half, device):
    calls.append((half, device))
    return 1.9
  chosen = precision.policy_for("auto", measure=measure)
  assert chosen.policy == "mixed_bfloat16" and calls == [("bfloat16", "/CPU:0")]
  assert chosen.measured().startswith("bfloat16 measured 1.90x float32 on ")
  monkeypatch.setattr(speed, "_MEMO", {})  # A new process: the file answers.
  again = precision.policy_for("auto", measure=measure)
  assert again.policy == "mixed_bfloat16" and len(calls) == 1
  assert again.measured().endswith("(cached)")


def test_the_probe_times_both_types_on_this_device():
  assert speed.probe_speedup("bfloat16", "/CPU:0", width=64, steps=2, rounds=1) > 0


@pytest.mark.parametrize("speedup,policy,said", [
    (2.0, "mixed_bfloat16", "bfloat16 mixed precision (auto: bfloat16 measured 2.00x float32 on "),
    (0.6, "float32", "float32: bfloat16 measured 0.60x float32 on "),
])
def test_fit_follows_the_probes_answer_and_says_what_it_measured(bf16_cpu, capsys, speedup,
                                                                  policy, said):
  precision.policy_for("auto", measure=lambda half, device: speedup)  # The machine's cache.
  speed._MEMO.clear()
  x, y = case.data()
  trained_in = []
  seen = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: trained_in.append(
      seen.model.layers[0].dtype_policy.name))
  model = tfdist.fit(case.model_fn, x, y, config={"strategy": "default"},
                     compile=case.compile_args, batch_size=32, epochs=1, verbose=0,
                     callbacks=[seen]).model
  assert set(trained_in) == {policy}  # Trained in what auto chose...
  assert model.layers[0].dtype_policy.name == "float32"  # ...and given back (issue 33).
  line = next(line for line in capsys.readouterr().out.splitlines()
              if line.startswith("tfdist: default"))
  assert said in line and "(cached)" in line, line


def test_bfloat16_model_computes_in_bfloat16_with_float32_outputs():
  x, y = case.data()
  config = {"strategy": "default", "training": {"mixed_precision": "bfloat16"}}
  model = tfdist.fit(case.model_fn, x, y, config=config, compile=case.compile_args,
                     batch_size=32, verbose=0).model
  assert [layer.dtype_policy.name for layer in model.layers] == ["mixed_bfloat16", "float32"]
  assert model.layers[0].kernel.dtype == "float32"  # Variables stay float32.
  assert tfdist.predict(model, x[:8], batch_size=8, verbose=0).dtype == np.float32
  import keras
  assert keras.config.dtype_policy().name == "float32"  # Keras's global policy is restored.


def test_the_matmul_peak_is_the_best_size_and_training_faster_than_it_raises_it(
    monkeypatch, tmp_path):
  """MFU never exceeds 1 (issue 50: float32 training measured 182 GFLOP/s against a 2048^3
  "peak" of 140): the peak is the best of `PEAK_SIZES`, and a run faster than it becomes it."""
  monkeypatch.setenv(speed.CACHE_ENV, str(tmp_path))
  monkeypatch.setattr(speed, "_MEMO", {})
  timed = []

  def fake_time(dtype, size, device):
    timed.append(size)
    return {512: 1e9, 1024: 3e9, 2048: 2e9, 4096: 2.5e9}[size]
  monkeypatch.setattr(speed, "_time_matmul", fake_time)
  peak = speed.matmul_peak("float32")
  assert sorted(timed) == sorted(speed.PEAK_SIZES["CPU"])
  assert (peak.flops, peak.size) == (3e9, 1024)
  assert not speed.raise_peak("float32", 2.9e9)
  assert speed.raise_peak("float32", 4e9)
  assert speed.matmul_peak("float32").flops == 4e9  # Measured again: from the cache, raised.
  assert sorted(timed) == sorted(speed.PEAK_SIZES["CPU"])


def _sampling_model():
  """keras-io's VAE's sampling: the layer draws its own float32 noise with TensorFlow's ops and
  multiplies it into its input (bfloat16 under a mixed policy): builds in float32 alone."""
  import tensorflow as tf

  class Sampling(keras.layers.Layer):
    def call(self, z):
      return z + tf.exp(0.5 * z) * tf.random.normal(tf.shape(z))

  print("MODEL_FN", flush=True)
  inputs = keras.Input((8,))
  return keras.Model(inputs, keras.layers.Dense(1)(Sampling()(keras.layers.Dense(4)(inputs))))


def test_auto_builds_in_float32_a_model_that_does_not_build_in_half_and_says_why_first(
    bf16_cpu, capsys):
  """Before, `auto`'s bfloat16 failed inside the user's model ("Input 'y' of 'Mul' Op has type
  float32 that does not match type bfloat16") before any line had said bfloat16 was chosen."""
  precision.policy_for("auto", measure=lambda half, device: 2.0)  # The machine's cache.
  speed._MEMO.clear()
  x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
  history = tfdist.fit(_sampling_model, x, x[:, :1], config={"strategy": "default"},
                       compile={"optimizer": "sgd", "loss": "mse"}, batch_size=16, verbose=0)
  assert np.isfinite(history.history["loss"]).all()
  assert history.model.layers[1].dtype_policy.name == "float32"
  lines = capsys.readouterr().out.splitlines()
  said = [i for i, line in enumerate(lines) if line.startswith("tfdist: building the model in "
                                                               "bfloat16 mixed precision (auto: ")]
  fell = [i for i, line in enumerate(lines) if line.startswith(
      "tfdist: the model did not build in bfloat16 mixed precision (")]
  built = [i for i, line in enumerate(lines) if line == "MODEL_FN"]
  assert said and fell and len(built) == 2, lines
  assert said[0] < built[0] < fell[0] < built[1], lines  # Said before the model was built.
  assert "does not match type bfloat16" in lines[fell[0]]
  start = next(line for line in lines if line.startswith("tfdist: default"))
  assert "float32: the model did not build in bfloat16" in start, start
