"""Where tfdist takes Keras's place, Keras's defaults hold (issue 50): numpy arrays with no batch
size anywhere train, evaluate and predict in batches of 32, as plain Keras's `fit`,
`evaluate` and `predict` do, to plain Keras's results."""

import numpy as np
import pytest

import tfdist
from tfdist import ConfigError

_CONFIG = {"training": {"mixed_precision": "off", "steps_per_execution": 1}}  # No batch size.


def _data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(100, 4)).astype("float32")  # 100: a last batch of 4 shows the size.
  return x, (x @ np.arange(1, 5, dtype="float32")[:, None]) / 4


def _model():
  import keras
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(
      1, kernel_initializer=keras.initializers.GlorotUniform(3))])
  model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
  return model


def test_numpy_input_without_a_batch_size_trains_in_kerass_batches_of_32():
  x, y = _data()
  history = tfdist.fit(_model, x, y, config=_CONFIG, epochs=2, shuffle=False, verbose=0)
  plain = _model()
  plain_history = plain.fit(x, y, epochs=2, shuffle=False, verbose=0)
  np.testing.assert_allclose(history.history["loss"], plain_history.history["loss"], rtol=1e-5)
  for got, want in zip(history.model.get_weights(), plain.get_weights(), strict=True):
    np.testing.assert_allclose(got, want, atol=1e-6)
  model = history.model
  np.testing.assert_allclose(tfdist.evaluate(model, x, y, config=_CONFIG, verbose=0),
                             plain.evaluate(x, y, verbose=0), rtol=1e-5)
  np.testing.assert_allclose(tfdist.predict(model, x, config=_CONFIG),
                             plain.predict(x, verbose=0), atol=1e-6)


def test_kerass_default_batch_that_does_not_split_over_the_replicas_is_refused_naming_it():
  x, y = _data()
  config = {**_CONFIG, "strategy": "mirrored", "devices": {"logical_cpus": 2}}
  tfdist.fit(_model, x, y, config=config, epochs=1, verbose=0)  # 32 over 2: fine.
  with pytest.raises(ConfigError, match=r"training.global_batch_size: is not set, and Keras's "
                                        r"default batch of 32 does not split over the 3"):
    from tfdist.training import settings
    settings.global_batch(tfdist.load_config(_CONFIG), 3, arrays=True)
