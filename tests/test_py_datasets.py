"""A `keras.utils.PyDataset` through tfdist.fit, evaluate and predict, against plain Keras's
`model.fit` of the same PyDataset on one device: the same history, weights and results, and the
same calls of the user's hooks (a PyDataset that reshuffles itself in `on_epoch_end` trains on
the same batches only if each call is made as Keras makes it). Multi_worker_mirrored, fit's
shuffle and reads in threads: tests/test_keras_contract.py's `py_dataset` case."""

import time

import keras
import numpy as np
import pytest

import tfdist

pytestmark = pytest.mark.usefixtures("two_cpus")
ROWS, BATCH, EPOCHS = 192, 32, 3
_rng = np.random.default_rng(6)
X = _rng.normal(size=(ROWS, 5)).astype("float32")
Y = (X[:, :2].sum(axis=1) > 0).astype("float32")[:, None]


class Reshuffled(keras.utils.PyDataset):
  """Keras's docs' PyDataset, reshuffling its rows (seeded) at each epoch's end; every read and
  hook logged in order."""

  def __init__(self, rows=ROWS, **kwargs):
    super().__init__(**kwargs)
    self.order, self.rng, self.log = np.arange(rows), np.random.default_rng(3), []

  def __len__(self):
    return len(self.order) // BATCH

  def __getitem__(self, index):
    self.log.append(index)
    rows = self.order[index * BATCH:(index + 1) * BATCH]
    return X[rows], Y[rows]

  def on_epoch_begin(self):
    self.log.append("begin")

  def on_epoch_end(self):
    self.log.append("end")
    self.rng.shuffle(self.order)


def make_model():
  init = keras.initializers.GlorotUniform(seed=3)
  model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, "relu", kernel_initializer=init),
                            keras.layers.Dense(1, kernel_initializer=init)])
  model.compile(optimizer=keras.optimizers.Adam(0.01),
                loss=keras.losses.BinaryCrossentropy(from_logits=True),
                metrics=[keras.metrics.BinaryAccuracy(threshold=0.0)])
  return model


def config(strategy):
  return {"strategy": strategy, "devices": {"logical_cpus": 2},
          "training": {"mixed_precision": "off"}}


def _runs(fit, evaluate, predict):
  """fit (3 epochs, validation on a second PyDataset), evaluate and predict on others; the
  results and each PyDataset's log."""
  train, validation, evaluated, predicted = Reshuffled(), Reshuffled(96), Reshuffled(), \
      Reshuffled()
  history = fit(train, validation)
  return (history, evaluate(history.model, evaluated), predict(history.model, predicted),
          [train.log, validation.log, evaluated.log, predicted.log])


def _plain():
  model = make_model()
  return _runs(lambda train, validation: model.fit(train, epochs=EPOCHS, shuffle=False,
                                                   validation_data=validation, verbose=0),
               lambda model, data: model.evaluate(data, verbose=0),
               lambda model, data: model.predict(data, verbose=0))


@pytest.mark.parametrize("strategy", ["mirrored", "central_storage"])
def test_a_py_dataset_trains_evaluates_and_predicts_as_plain_keras_and_calls_its_hooks_alike(
    strategy):
  want_history, want_evaluate, want_predict, want_logs = _plain()
  history, evaluated, predicted, logs = _runs(
      lambda train, validation: tfdist.fit(make_model, train, config=config(strategy),
                                           epochs=EPOCHS, shuffle=False,
                                           validation_data=validation, verbose=0),
      lambda model, data: tfdist.evaluate(model, data, config=config(strategy)),
      lambda model, data: tfdist.predict(model, data, config=config(strategy)))
  assert history.history.keys() == want_history.history.keys()
  for key, values in want_history.history.items():
    np.testing.assert_allclose(history.history[key], values, atol=1e-5, err_msg=key)
  np.testing.assert_allclose(evaluated, want_evaluate, atol=1e-5)
  np.testing.assert_allclose(predicted, want_predict, atol=1e-5)
  assert logs == want_logs


class _SlowLast(Reshuffled):
  """Its last batch read slowest (logged once read): a hook called before the pass's reads are
  done comes before it in the log."""

  def __getitem__(self, index):
    if index == len(self) - 1:  # Logged after the wait (popping its entry raced other threads').
      time.sleep(0.3)
    return super().__getitem__(index)


def test_threads_read_a_pass_between_its_hooks_and_fits_shuffle_orders_each_epoch_anew():
  """Reads in 3 threads: each pass's reads all fall between its `on_epoch_begin` and its
  `on_epoch_end`; fit's shuffle gives each epoch a new order of every batch."""
  train = _SlowLast(workers=3, max_queue_size=2)
  tfdist.fit(make_model, train, config=config("mirrored"), epochs=EPOCHS, verbose=0)
  log = train.log[3:]  # After the signature's first two reads and Keras's first reset.
  assert train.log[:3] == [0, 1, "end"]
  passes = []
  while log:
    assert log[0] == "begin", log
    end = log.index("end")
    passes.append(log[1:end])
    log = log[end + 1:]
  assert len(passes) == EPOCHS
  assert all(sorted(p) == list(range(6)) for p in passes), passes
  assert len({tuple(p) for p in passes}) == EPOCHS, passes  # Each epoch its own order.


class _Endless(Reshuffled):
  @property
  def num_batches(self):
    return None


class _OneArray(Reshuffled):
  def __getitem__(self, index):
    return {"rows": X[:BATCH]}, Y[:BATCH], None, 1


@pytest.mark.parametrize("data,kwargs,message", [
    (lambda: Reshuffled(use_multiprocessing=True, workers=2), {},
     "train_data: tfdist reads a PyDataset's batches in threads .* Received: "
     "use_multiprocessing=True$"),
    (_Endless, {"steps_per_epoch": 2},
     r"train_data: a PyDataset without an end \(num_batches=None\) .* Received: "
     "num_batches=None$"),
    (_OneArray, {}, r"train_data: a PyDataset's __getitem__ must return \(x,\), \(x, y\), .* "
     "Received: tuple of 4$"),
    (Reshuffled, {"batch_size": 64}, "train_data: a PyDataset's batches are the global "
     r"batches: .*, 64, differs; .* Received: a PyDataset of batches of 32$"),
    (Reshuffled, {"steps_per_epoch": 4}, r"steps_per_epoch: must divide the 6 batches .* "
     "Received: 4$"),
    (Reshuffled, {"validation_split": 0.2}, "validation_split: needs numpy arrays or tensors"),
])
def test_what_tfdist_cannot_read_as_keras_does_is_refused_in_one_line(data, kwargs, message):
  with pytest.raises(ValueError, match=message) as refused:
    tfdist.fit(make_model, data(), config=config("mirrored"), epochs=1, verbose=0, **kwargs)
  assert "\n" not in str(refused.value)
