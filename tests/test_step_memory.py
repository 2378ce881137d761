"""The training memory `tfdist estimate` gives is read from the traced step: a recurrent layer's
every time step, attention's scores, nested models' layers and the loss's logits count, and
the estimate is within 2.5x of TensorFlow's allocator peak measured during a real step (a bound
the peak's spread between processes cannot cross; 1.5x is the benchmark's target)."""

import concurrent.futures
import json
import os
import subprocess
import sys

import keras
import pytest

from tfdist.parallel.step_memory import LOSS_AND_INPUTS, step_tensors
from tfdist.testing import forked
from tests.conftest import PROGRAMS, REPO
from tests.launching import ENV

pytestmark = pytest.mark.usefixtures("two_cpus")  # TensorFlow starts with the suite's devices.


def _lstm(steps):
  model = keras.Sequential([keras.Input((steps, 8)), keras.layers.LSTM(32, name="lstm"),
                            keras.layers.Dense(1)])
  model.compile("adam", "mse")
  return model


def test_a_recurrent_layer_keeps_what_every_time_step_needs():
  short, long = (step_tensors(_lstm(steps), batch=16).by_unit["lstm"] for steps in (100, 200))
  assert 1.9 < long / short < 2.1, (short, long)
  # At least its state (hidden and carry, batch x units) at every step, not its output alone.
  assert short > 2 * 100 * 16 * 32 * 4


def test_attention_keeps_its_scores():
  inputs = keras.Input((128, 16))
  attended = keras.layers.MultiHeadAttention(num_heads=4, key_dim=4, name="attention")(
      inputs, inputs)
  model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Flatten()(attended)))
  model.compile("sgd", "mse")
  assert step_tensors(model, batch=8).by_unit["attention"] >= 8 * 4 * 128 * 128 * 4


def test_a_nested_models_layers_are_its_own_units():
  block = keras.Sequential([keras.Input((64,)), keras.layers.Dense(512, name="wide"),
                            keras.layers.ReLU(name="relu"), keras.layers.Dense(64, name="narrow")],
                           name="block")
  inputs = keras.Input((64,))
  model = keras.Model(inputs, keras.layers.Dense(1, name="head")(block(inputs)))
  model.compile("sgd", "mse")
  kept = step_tensors(model, batch=32).by_unit  # By the unit that made each tensor:
  assert kept["relu"] >= 32 * 512 * 4  # the ReLU's output (its gradient reads it),
  assert kept["narrow"] >= 32 * 64 * 4  # the nested model's output (the head's reads it).


def test_the_loss_keeps_the_logits_size():
  inputs = keras.Input((16,), dtype="int32")
  logits = keras.layers.Dense(5000)(keras.layers.Embedding(100, 8)(inputs))
  model = keras.Model(inputs, logits)
  model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  assert step_tensors(model, batch=4).by_unit[LOSS_AND_INPUTS] >= 4 * 16 * 5000 * 4


def test_an_open_sequence_length_must_be_given():
  model = keras.Sequential([keras.Input((None, 8)), keras.layers.GRU(4), keras.layers.Dense(1)])
  model.compile("sgd", "mse")
  with pytest.raises(ValueError, match="leaves a dimension open: give the length"):
    step_tensors(model, batch=2)
  assert step_tensors(model, batch=2, length=50).kept > step_tensors(model, 2, length=5).kept


# A measured step's peak varied by up to 1.6x between processes (13.6 and 21.1 MB at 1,024 rows;
# an attention step 1.4x): a bound of 2.5x either way is one that spread cannot cross, and an
# estimate 2.5x off is wrong. The figures and their spread for every family (KerasHub's GPT-2,
# a CNN, a GRU, a nested model too), against 1.5x: benchmarks/bench_memory_estimate.py and
# BUILD_NOTES.md.
BOUND = 2.5


def _measured(*models: str) -> list[dict]:
  """memory_peak.py's RESULT of each model, each in a process of its own (in one process, what
  earlier models left in the allocator moved an attention step's peak by 1.4x), two at a time."""
  def measure(model):
    return subprocess.run([sys.executable, str(PROGRAMS / "memory_peak.py"), model],
                          env={**ENV, "TF_CPU_ALLOCATOR_USE_BFC": "true"}, cwd=REPO,
                          capture_output=True, text=True, timeout=240)
  results = []
  with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    for done in pool.map(measure, models):
      assert done.returncode == 0, done.stderr[-3000:]
      results += [json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines()
                  if line.startswith("RESULT ")]
  return results


def test_the_estimate_is_within_its_bound_of_the_measured_step():
  """A dense, a recurrent and an attention model's step, and a loss over wide logits, measured
  by TensorFlow's own allocator statistics (the BFC allocator keeps them on CPU): the peak
  during `train_on_batch` less what was allocated before, against the estimate's activations,
  working memory and gradients."""
  models = ["mlp", "lstm", "attention", "logits"]
  results = _measured(*models)
  assert [r["model"] for r in results] == models
  for r in results:
    assert 1 / BOUND <= r["estimated"] / r["measured"] <= BOUND, r


_MLP = ("import keras\n"  # memory_peak.py's mlp, as a user's module.
        "def mlp():\n"
        "  model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(1024, "
        "activation='relu'), keras.layers.Dense(1024, activation='relu'), "
        "keras.layers.Dense(10)])\n"
        "  model.compile('adam', keras.losses.SparseCategoricalCrossentropy(from_logits=True))\n"
        "  return model\n")


def _row(stdout: str) -> float:
  """Gradients, activations and working memory (bytes) of `tfdist estimate`'s data-parallel row."""
  row = next(line for line in stdout.splitlines() if line.startswith("data parallel, each"))
  _, gradients, _, activations, working = (float(row.split()[i]) for i in range(3, 13, 2))
  return (gradients + activations + working) * 2 ** 20


def test_tfdist_estimate_of_1_2_and_4_workers_is_within_its_bound_of_a_replicas_peak(tmp_path):
  """`tfdist estimate` on cluster configs of 1, 2 and 4 workers (global batch 4096): its
  per-replica gradients, activations and working memory against TensorFlow's allocator peak
  of one step at that replica's batch (4096, 2048, 1024), measured as above."""
  (tmp_path / "models.py").write_text(_MLP)

  def estimate(workers):
    (tmp_path / f"w{workers}.yaml").write_text(f"cluster: {{worker: {workers}}}\n"
                                               "training: {global_batch_size: 4096}\n")
    return workers, forked.run(
        [sys.executable, "-m", "tfdist", "estimate", f"w{workers}.yaml", "--model",
         "models:mlp"], cwd=tmp_path, env=ENV, timeout=120)

  with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
    estimates = list(pool.map(estimate, (1, 2, 4)))
    measured = {r["batch"]: r["measured"] for r in _measured("mlp@4096", "mlp@2048", "mlp@1024")}
  for workers, done in estimates:
    assert done.returncode == 0, done.stderr[-2000:]
    if workers > 1:
      assert f"({4096 // workers} per replica), {workers} replica(s)" in done.stdout
    batch = 4096 // workers
    assert 1 / BOUND <= _row(done.stdout) / measured[batch] <= BOUND, (batch, done.stdout)


def test_tfdist_estimate_needs_the_length_a_model_leaves_open(tmp_path):
  (tmp_path / "models.py").write_text(
      "import keras\n"
      "def reader():\n"
      "  model = keras.Sequential([keras.Input((None, 8)), keras.layers.LSTM(16),\n"
      "                            keras.layers.Dense(1)])\n"
      "  model.compile('adam', 'mse')\n"
      "  return model\n")
  (tmp_path / "config.yaml").write_text("training: {global_batch_size: 32}\n")

  def estimate(*flags):
    return forked.run([sys.executable, "-m", "tfdist", "estimate", "config.yaml",
                       "--model", "models:reader", *flags], cwd=tmp_path,
                      env={**ENV, "PYTHONPATH": os.pathsep.join([str(REPO), "."])},
                      timeout=120)
  refused = estimate()
  assert refused.returncode == 2
  assert refused.stderr.strip().splitlines()[-1].startswith(
      "tfdist estimate: --length: is needed: input ")
  counted = estimate("--length", "1000")
  assert counted.returncode == 0, counted.stderr[-2000:]
  assert "global batch 32, length 1000" in counted.stdout
