"""Shared pieces of the benchmarks: the model, generated data, timing and the table.

Throughput on these shared 2-core machines swings up to 2x from minute to minute, so every
benchmark interleaves its contenders in one process (A, B, A, B, ...) and reports the median of
each one's runs and the ratio of the medians.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable, Mapping

import numpy as np

INPUTS, HIDDEN, CLASSES = 784, 1024, 10


def data(samples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """MNIST-shaped generated data: no download."""
  rng = np.random.default_rng(seed)
  x = rng.random((samples, INPUTS), dtype=np.float32)
  y = rng.integers(0, CLASSES, samples).astype("int32")
  return x, y


def model_fn(depth: int = 2):
  """An MLP 784-1024-1024-10 (1.86 M parameters; `depth` hidden layers of 1024)."""
  import keras
  return keras.Sequential([
      keras.Input((INPUTS,)),
      *(keras.layers.Dense(HIDDEN, activation="relu") for _ in range(depth)),
      keras.layers.Dense(CLASSES),
  ])


def parameters(depth: int = 2) -> int:
  return INPUTS * HIDDEN + HIDDEN + (depth - 1) * (HIDDEN * HIDDEN + HIDDEN) + \
      HIDDEN * CLASSES + CLASSES


def compile_args():
  import keras
  return dict(optimizer=keras.optimizers.Adam(1e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              metrics=["accuracy"])


class EpochTimer:
  """A Keras callback timing every epoch but the first (which traces and warms up)."""

  def __new__(cls):
    import keras

    class _Timer(keras.callbacks.Callback):
      def __init__(self):
        super().__init__()
        self.seconds: list[float] = []

      def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

      def on_epoch_end(self, epoch, logs=None):
        if epoch:
          self.seconds.append(time.perf_counter() - self._start)
    return _Timer()


def interleave(contenders: Mapping[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
  """Runs each contender (returning samples/s) once per round, in turn."""
  results: dict[str, list[float]] = {name: [] for name in contenders}
  for _ in range(rounds):
    for name, run in contenders.items():
      results[name].append(run())
  return results


def table(results: Mapping[str, list[float]], baseline: str, unit: str = "samples/s") -> str:
  base = statistics.median(results[baseline])
  rows = [f"| contender | median {unit} | runs | ratio to {baseline} |", "|---|---|---|---|"]
  digits = 0 if base >= 100 else 2
  for name, values in results.items():
    median = statistics.median(values)
    runs = ", ".join(f"{v:,.{digits}f}" for v in values)
    rows.append(f"| {name} | {median:,.{digits}f} | {runs} | {median / base:.2f} |")
  return "\n".join(rows)
