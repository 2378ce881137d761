"""`training.mixed_precision`: which policy each mode means on which machine, and what a model
built by tfdist.fit under it computes in."""

import numpy as np
import pytest

import tfdist
from tfdist.training import precision
from tests.programs import equivalence_case as case

pytestmark = pytest.mark.usefixtures("two_cpus")  # TensorFlow starts with the suite's devices.


@pytest.mark.parametrize("mode,flags,gpus,policy", [
    ("off", {"avx512_bf16"}, [(9, 0)], "float32"),
    ("bfloat16", set(), [], "mixed_bfloat16"),
    ("float16", set(), [], "mixed_float16"),
    ("auto", {"avx512f", "amx_bf16"}, [], "mixed_bfloat16"),
    ("auto", {"avx512f", "avx512_bf16"}, [], "mixed_bfloat16"),
    ("auto", {"avx512f", "avx2"}, [], "float32"),
    ("auto", set(), [(8, 0), (9, 0)], "mixed_bfloat16"),
    ("auto", {"avx512_bf16"}, [(7, 5)], "mixed_float16"),  # The GPUs decide, the oldest one.
    ("auto", set(), [(8, 6), (7, 0)], "mixed_float16"),
    ("auto", set(), [(6, 1)], "float32"),
])
def test_policy_for_each_mode_and_machine(mode, flags, gpus, policy):
  assert precision.choose_policy(mode, flags, gpus) == policy


def test_auto_leaves_float16_out_where_loss_scaling_fails():
  assert precision.choose_policy("auto", set(), [(7, 5)], loss_scaling=False) == "float32"
  assert precision.choose_policy("auto", set(), [(8, 0)], loss_scaling=False) == "mixed_bfloat16"


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16\n\n"
                     "processor\t: 1\nflags\t\t: fpu amx_bf16\n")
  assert precision.cpu_flags(cpuinfo) == {"fpu", "avx512f", "avx512_bf16", "amx_bf16"}
  assert precision.cpu_flags(tmp_path / "missing") == set()


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
