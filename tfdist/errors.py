"""The errors tfdist raises for a user's mistakes.

A user's mistake (a config, a flag, a dataset) is reported in one line that names where it is,
the rule it breaks and what was received; the CLI prints that line and exits with code 2,
without a traceback.
"""

from __future__ import annotations

_MISSING = object()
_MAX_RECEIVED = 120


def _short_repr(value) -> str:
  text = repr(value)
  return text if len(text) <= _MAX_RECEIVED else text[:_MAX_RECEIVED - 3] + "..."


class TfdistError(Exception):
  """Base class of tfdist's errors."""


class ConfigError(TfdistError, ValueError):
  """A config (YAML file, mapping, TF_CONFIG or flag) breaks a rule.

  The message reads `SOURCE: KEY: RULE. Received: VALUE`, always on one line.

  Args:
    rule: what was expected, as a sentence without the final period.
    key: the dotted key path in the config, such as `cluster.worker[1]`.
    received: the offending value; omitted when there is none to show.
    source: the file, `TF_CONFIG` or `--flag` the value came from.
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
    """Returns this error with its key nested under `prefix`."""
    key = prefix if not self.key else (
        f"{prefix}{self.key}" if self.key.startswith("[") else f"{prefix}.{self.key}")
    return ConfigError(self.rule, key=key, received=self.received, source=self.source)

  def from_source(self, source: str | None) -> "ConfigError":
    """Returns this error naming `source`, unless it already names one."""
    if self.source or not source:
      return self
    return ConfigError(self.rule, key=self.key, received=self.received, source=source)


class ModelError(TfdistError, ValueError):
  """A model tfdist was given cannot be used as it is (not compiled, not built); the message
  says what to do."""


class MissingExtraError(TfdistError, ImportError):
  """A feature's optional packages are not installed; the message names the extra."""


class DeviceSetupError(TfdistError, RuntimeError):
  """Devices were asked for after TensorFlow had already initialised its own."""


class UnsupportedError(TfdistError, RuntimeError):
  """A call that TensorFlow or Keras cannot run under this strategy; the message names the
  call that does the same and works."""
