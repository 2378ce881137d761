"""Gradient compression: the all-reduce in bfloat16 or float16 trains the digits example to plain
Keras's loss curve on one device within a stated tolerance, and is really applied (TensorFlow
traced the gradients' all-reduce in that dtype)."""

import keras
import numpy as np
import pytest
from sklearn.datasets import load_digits

import tfdist
from tests import traced

pytestmark = pytest.mark.usefixtures("two_cpus")
# The stated tolerance: each epoch's loss within 0.1% (bfloat16: 8 bits of mantissa in the sum)
# and 0.05% (float16: 11 bits) of plain Keras's in float32. Measured against tfdist's float32
# all-reduce: 7e-5 and 3e-5.
LOSS_TOLERANCE = {"bfloat16": 1e-3, "float16": 5e-4}


def _data():
  x, y = load_digits(return_X_y=True)
  return (x / 16.0).astype("float32")[:1024], y[:1024]


def _model():
  keras.utils.set_random_seed(3)
  return keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                           keras.layers.Dense(10)])


def _compile():
  return dict(optimizer=keras.optimizers.Adam(3e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def train(compression):
  """tfdist on mirrored over 2 logical CPUs: the loss of each epoch, and the collectives
  TensorFlow traced ({(op type, dtype): elements})."""
  x, y = _data()
  config = {"strategy": "mirrored", "devices": {"logical_cpus": 2},
            "training": {"global_batch_size": 64, "epochs": 4, "mixed_precision": "off",
                         "gradient_compression": compression}}
  with traced.collectives() as collectives:
    history = tfdist.fit(_model, x, y, config=config, verbose=0, shuffle=False,
                         compile=_compile)
  return np.array(history.history["loss"]), collectives


def plain():
  """The reference: plain Keras on one device, no tfdist, the same model, data and batches."""
  x, y = _data()
  model = _model()
  model.compile(**_compile())
  return np.array(model.fit(x, y, batch_size=64, epochs=4, shuffle=False,
                            verbose=0).history["loss"])


@pytest.mark.parametrize("compression", ["bfloat16", "float16"])
def test_compressed_all_reduce_follows_plain_keras_loss_curve(compression):
  exact = plain()
  compressed, collectives = train(compression)
  assert exact[-1] < 0.5 * exact[0]  # It learns.
  np.testing.assert_allclose(compressed, exact, rtol=LOSS_TOLERANCE[compression])
  # Applied: what TensorFlow traced all-reduces every gradient in the compressed dtype.
  parameters = 64 * 64 + 64 + 64 * 10 + 10
  reduced = {dtype: n for (op, dtype), n in collectives.items() if op == "CollectiveReduceV2"}
  assert reduced.get(compression, 0) >= parameters, reduced
  assert reduced.get("float32", 0) < parameters, reduced


def test_compression_is_a_training_setting_of_the_synchronous_strategies(write_config):
  with pytest.raises(tfdist.ConfigError, match=r"training.gradient_compression: must be one of "
                     r"none, bfloat16, float16. Received: 'int8'"):
    tfdist.load_config({"strategy": "mirrored", "training": {"gradient_compression": "int8"}})
  with pytest.raises(tfdist.ConfigError, match=r"training.gradient_compression: needs strategy "
                     r"mirrored or multi_worker_mirrored, not central_storage"):
    tfdist.load_config({"strategy": "central_storage",
                        "training": {"gradient_compression": "bfloat16"}})
  config = tfdist.load_config(write_config(
      "cluster: {worker: 2}\ntraining: {gradient_compression: bfloat16}\n"), environ={})
  assert config.training.gradient_compression == "bfloat16"


def test_the_old_strategy_spelling_still_works_for_this_release_with_a_notice(write_config):
  path = write_config("cluster: {worker: 2}\nstrategy: {name: multi_worker_mirrored, "
                      "gradient_compression: bfloat16, average_every: 0}\n")
  with pytest.warns(FutureWarning, match=r"^strategy.gradient_compression is now "
                                         r"training.gradient_compression; the old spelling goes "
                                         r"in 0.2$"):
    config = tfdist.load_config(path, environ={})
  assert config.training.gradient_compression == "bfloat16"
  both = write_config("strategy: {name: mirrored, gradient_compression: bfloat16}\n"
                      "training: {gradient_compression: float16}\n", name="both.yaml")
  with pytest.raises(
      tfdist.ConfigError, match=r"training.gradient_compression: must be given alone; "
                                r"strategy.gradient_compression \('bfloat16'\) is its old "
                                r"spelling. Received: 'float16'"):
    tfdist.load_config(both, environ={})
