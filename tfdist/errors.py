"""The errors tfdist raises for a user's mistakes.

A user's mistake (a config, a flag, a dataset) is reported in one line that names where it is,
the rule it breaks and what was received; the CLI prints that line and exits with code 2,
without a traceback.
"""

from __future__ import annotations

from tfdist.exit_codes import USAGE

_MISSING = object()
_MAX_RECEIVED = 120


def _short_repr(value) -> str:
  text = repr(value)
  return text if len(text) <= _MAX_RECEIVED else text[:_MAX_RECEIVED - 3] + "..."


class TfdistError(Exception):
  """Base class of tfdist's errors: `except tfdist.TfdistError` catches every one of them.

  Example:

  ```python
  import tfdist
  try:
    tfdist.load_config({"strategy": "mirrored", "training": {"epochs": 0}})
  except tfdist.TfdistError as e:
    print(e)   # <dict>: training.epochs: must be greater than 0. Received: 0
  ```
  """


class ConfigError(TfdistError, ValueError):
  """A config (YAML file, mapping, TF_CONFIG or flag) breaks a rule.

  The message reads `SOURCE: KEY: RULE. Received: VALUE`, always on one line.

  Args:
    rule: what was expected, as a sentence without the final period.
    key: the dotted key path in the config, such as `cluster.worker[1]`.
    received: the offending value; omitted when there is none to show.
    source: the file, `TF_CONFIG` or `--flag` the value came from.

  Example:

  ```python
  import tfdist
  try:
    tfdist.load_config({"strategy": "mirored"})
  except tfdist.ConfigError as e:
    print(e)       # <dict>: strategy.name: must be one of default, ... Received: 'mirored'
    print(e.key)   # strategy.name
  ```
  """

  def __init__(self, rule: str, *, key: str | None = None, received=_MISSING,
               source: str | None = None):
    self.rule = rule
    self.key = key
    self.received = received
    self.source = source
    super().__init__(self._message())

  def _message(self) -> str:
    parts = [p for p in (self.source, self.key) if p]
    text = ": ".join(parts + [self.rule]) + "."
    if self.received is not _MISSING:
      text += f" Received: {_short_repr(self.received)}"
    return " ".join(text.split("\n"))

  def within(self, prefix: str) -> "ConfigError":
    """This error with its key nested under `prefix` (a loader reporting a section's error).

    Args:
      prefix: the enclosing key, such as `cluster` (`worker[1]` becomes `cluster.worker[1]`).

    Returns:
      A new `ConfigError`.
    """
    key = prefix if not self.key else (
        f"{prefix}{self.key}" if self.key.startswith("[") else f"{prefix}.{self.key}")
    return ConfigError(self.rule, key=key, received=self.received, source=self.source)

  def from_source(self, source: str | None) -> "ConfigError":
    """This error naming `source`, unless it already names one.

    Args:
      source: the file, `TF_CONFIG` or `--flag` the value came from; None changes nothing.

    Returns:
      A `ConfigError` (this one when nothing changes).
    """
    if self.source or not source:
      return self
    return ConfigError(self.rule, key=self.key, received=self.received, source=source)


class ModelError(TfdistError, ValueError):
  """A model tfdist was given cannot be used as it is (not compiled, not built); the message
  says what to do.

  Example:

  ```python
  import keras
  import numpy as np
  import tfdist
  try:
    tfdist.fit(lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]),
               np.zeros((8, 4)), np.zeros((8, 1)), config={"strategy": "default"})
  except tfdist.ModelError as e:
    print(e)   # model_fn returned a model that is not compiled: compile it there or ...
  ```
  """


class DataError(TfdistError, ValueError):
  """Training data of a kind or shape tfdist cannot feed; the message names the argument, what
  was expected and what was received.

  Example:

  ```python
  import numpy as np
  import tfdist
  try:
    tfdist.fit(make_model, np.zeros((8, 4)), config={"strategy": "default"})
  except tfdist.errors.DataError as e:
    print(e)   # x: numpy input needs a batch size: ...
  ```
  """


class MissingExtraError(TfdistError, ImportError):
  """A feature's optional packages are not installed; the message names the extra to install
  (`tfdist model-server` without aiohttp: "pip install 'tfdist[serving]'"). An `ImportError`,
  so code that catches those catches it too.

  Example:

  ```python
  import tfdist
  assert issubclass(tfdist.MissingExtraError, ImportError)
  ```
  """


class DeviceSetupError(TfdistError, RuntimeError):
  """Devices were asked for after TensorFlow had already initialised its own.

  Example:

  ```python
  import tensorflow as tf
  import tfdist
  tf.constant(1.0)   # TensorFlow initialises its devices here.
  try:
    tfdist.mirrored(logical_cpus=3)
  except tfdist.DeviceSetupError as e:
    print(e)   # devices.logical_cpus: must be applied before TensorFlow initialises ...
  ```
  """


class UnsupportedError(TfdistError, RuntimeError):
  """A call that TensorFlow or Keras cannot run under this strategy; the message names the
  call that does the same and works (`model.predict` under parameter_server: "call
  tfdist.predict(model, x)"). A `RuntimeError`, as TensorFlow's own errors of this kind are.

  Example:

  ```python
  import tfdist
  assert issubclass(tfdist.UnsupportedError, RuntimeError)
  ```
  """


TRACEBACK_ENV = "TFDIST_TRACEBACK"


def report_in_one_line() -> None:
  """Makes an uncaught `TfdistError` in this process print as one line (`tfdist: ...`, as the
  CLI prints it) and exit with 2, the CLI's code for a refused config; other exceptions, and
  every one with `TFDIST_TRACEBACK=1`, keep Python's traceback. `import tfdist` calls it in a
  task `tfdist launch` started, where the launcher shows the line as the root cause."""
  import os
  import sys
  keras_hook = sys.excepthook

  def hook(kind, value, traceback):
    if issubclass(kind, TfdistError) and os.environ.get(TRACEBACK_ENV) != "1":
      print(f"tfdist: {value} (TFDIST_TRACEBACK=1 shows the traceback)", file=sys.stderr,
            flush=True)
      os._exit(USAGE)  # TensorFlow's threads could keep a normal exit waiting.
    keras_hook(kind, value, traceback)
  sys.excepthook = hook
