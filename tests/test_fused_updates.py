"""The fused optimizer updates (training.fused_optimizer, the default) train the same model as
Keras's own updates, under one device and the single-machine strategies. When Keras changes an
update's formula these comparisons fail: then follow Keras (or drop that optimizer)."""

import numpy as np
import pytest
import keras

import tfdist
from tfdist.training import fused_updates

pytestmark = pytest.mark.usefixtures("two_cpus")

OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(0.1),
    "adamw": lambda: keras.optimizers.AdamW(0.1, weight_decay=0.1),
    "sgd": lambda: keras.optimizers.SGD(0.05),
    "momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "nesterov": lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
}


def regression():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(64, 6)).astype("float32")
  y = (x @ rng.normal(size=(6, 3)) + 1.0).astype("float32")
  return x, y


def train(strategy: str, optimizer: str, fused: bool):
  x, y = regression()

  def model_fn():
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(
        3, kernel_initializer=keras.initializers.GlorotUniform(3))])

  history = tfdist.fit(
      model_fn, x, y, config={"strategy": strategy, "devices": {"logical_cpus": 2},
                              "training": {"fused_optimizer": fused, "mixed_precision": "off",
                                           "steps_per_execution": 1}},
      compile=lambda: dict(optimizer=OPTIMIZERS[optimizer](), loss="mse"), batch_size=16,
      epochs=3, shuffle=False, verbose=0)
  model = history.model
  assert ("update_step" in vars(model.optimizer)) == fused  # The fused step is the one in use.
  return (history.history["loss"], model.get_weights(),
          [np.asarray(v) for v in model.optimizer.variables])


@pytest.mark.parametrize("strategy", ["default", "mirrored", "central_storage"])
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_fused_update_trains_the_same_model_as_keras(strategy, optimizer):
  # Adam's kernel takes 1 - beta_1 in float32 where Keras subtracts in float64: the factors are
  # 2e-7 apart, 1e-5 after 12 steps.
  rtol = 1e-4 if optimizer.startswith("adam") else 1e-6
  keras_losses, keras_weights, keras_slots = train(strategy, optimizer, fused=False)
  losses, weights, slots = train(strategy, optimizer, fused=True)
  np.testing.assert_allclose(losses, keras_losses, rtol=rtol)
  assert keras_losses[-1] < 0.8 * keras_losses[0]  # 12 steps that do move the weights.
  for got, want in zip(weights + slots, keras_weights + keras_slots, strict=True):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol)


def test_fused_update_is_set_on_the_object_only_where_a_kernel_exists():
  adam = keras.optimizers.Adam()
  assert fused_updates.install(adam) and "update_step" in vars(adam)
  assert "update_step" not in vars(keras.optimizers.Adam())  # The class is untouched.
  for unfused in (keras.optimizers.Adam(amsgrad=True), keras.optimizers.RMSprop(),
                  keras.optimizers.Adagrad()):
    assert not fused_updates.install(unfused) and "update_step" not in vars(unfused)
  scaled = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
  assert fused_updates.install(scaled) and "update_step" in vars(scaled.inner_optimizer)
