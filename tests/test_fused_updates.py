"""The fused optimizer updates (training.fused_optimizer, off by default) train the same model
as Keras's own updates, under one device and the single-machine strategies: SGD's exactly,
Adam's within 1e-4 over 12 steps (its kernel takes 1 - beta in float32); and the defaults keep
Keras's own Adam, one device's weights within 1e-5 after 128 steps. When Keras changes an
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


@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_the_defaults_keep_keras_adam_over_a_hundred_steps(strategy):
  """tfdist.fit's defaults (float32 asked for) against plain Keras's Adam on one device: 128
  steps of an MLP, where the fused kernel drifts 7e-2 (BUILD_NOTES.md)."""
  rng = np.random.default_rng(1)
  x = rng.normal(size=(512, 16)).astype("float32")
  y = (x[:, :8].sum(axis=1) > 0).astype("int32")

  def model_fn():
    init = keras.initializers.GlorotUniform(5)
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(64, "relu", kernel_initializer=init),
                              keras.layers.Dense(64, "relu", kernel_initializer=init),
                              keras.layers.Dense(2, kernel_initializer=init)])
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
  plain = model_fn()
  plain.fit(x, y, batch_size=32, epochs=8, shuffle=False, verbose=0)
  config = {"training": {"mixed_precision": "off"},
            **({"strategy": "mirrored", "devices": {"logical_cpus": 2}}
               if strategy == "mirrored" else {})}
  model = tfdist.fit(model_fn, x, y, config=config, batch_size=32, epochs=8, shuffle=False,
                     verbose=0).model
  assert "update_step" not in vars(model.optimizer)
  for got, want in zip(model.get_weights(), plain.get_weights(), strict=True):
    np.testing.assert_allclose(got, want, atol=1e-5)
