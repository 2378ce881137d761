"""Keras's own arguments of `Model.fit`, `Model.evaluate` and `Model.predict` through
`tfdist.fit`, `tfdist.evaluate` and `tfdist.predict`: every parameter of those signatures, with
what tfdist does with it, in one table per method (`FIT`, `EVALUATE`, `PREDICT`).

tfdist makes the dataset itself (batched by the global batch, shuffled alike on every worker,
sharded by the strategy), so the arguments Keras applies to arrays before it makes its own
dataset are applied here first, as Keras applies them: `validation_split` cuts the last
fraction of the arrays off before any shuffle, and `sample_weight` is zipped with `x` and `y`
(keras/src/trainers/data_adapters/array_slicing.py, `train_validation_split`; the array
adapter). The others go to Keras with their meaning, or are refused in one line saying why.
tests/test_keras_arguments.py reads the installed Keras's signatures: a parameter Keras adds
fails it until this table says what tfdist does with it.

```python
x, y, sample_weight, validation = keras_arguments.split_validation(
    x, y, sample_weight, validation_split=0.2, validation_data=None)
```
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from tfdist.errors import ConfigError

TFDIST = "tfdist"
"""Taken by tfdist before it makes the dataset (or its own loop)."""
KERAS = "keras"
"""Passed to Keras's own method, which applies it."""

SYNCHRONOUS = "tfdist.fit under the synchronous strategies"
PARAMETER_SERVER = "the parameter-server loop"


@dataclasses.dataclass(frozen=True)
class Argument:
  """What tfdist does with one parameter of a Keras method.

  Attributes:
    by: `TFDIST` (tfdist applies it, with Keras's meaning) or `KERAS` (passed on).
    meaning: how, in a sentence (the docs' table).
    refused: the paths that refuse it when given, each with why.
  """
  by: str
  meaning: str
  refused: Mapping[str, str] = dataclasses.field(default_factory=dict)


_PS_KERAS_LOOP = ("the parameter-server loop is tfdist's own coordinator loop, not Keras's: "
                  "it takes batch_size, epochs, steps_per_epoch, initial_epoch, shuffle, "
                  "validation_data, validation_split, validation_batch_size, callbacks and "
                  "verbose")

FIT: dict[str, Argument] = {
    "x": Argument(TFDIST, "`train_data`: arrays, a dataset of global batches, a dataset "
                  "function, a generator or a `keras.utils.PyDataset` of global batches (its "
                  "hooks called as Keras calls them), made into the strategy's dataset"),
    "y": Argument(TFDIST, "the targets of array `x`"),
    "batch_size": Argument(TFDIST, "the global batch (every replica takes its share)"),
    "epochs": Argument(TFDIST, "the epoch to end before; default training.epochs"),
    "verbose": Argument(KERAS, "Keras's progress output (the chief's)"),
    "callbacks": Argument(TFDIST, "the user's callbacks, between tfdist's progress and "
                          "TensorBoard's; files written on the chief alone"),
    "validation_split": Argument(TFDIST, "the last fraction of array `x`, `y` and "
                                 "`sample_weight` cut off before shuffling, as Keras does; "
                                 "ignored when `validation_data` is given, as by Keras"),
    "validation_data": Argument(TFDIST, "arrays or a dataset, evaluated at each epoch's end"),
    "shuffle": Argument(TFDIST, "array `x`, or a PyDataset's batches, shuffled each epoch by "
                        "(training.seed, epoch), the same order on every worker; a dataset is "
                        "kept as it comes"),
    "class_weight": Argument(TFDIST, "each example's loss weighed by its class, by Keras's own "
                             "map of the batches (of arrays, a dataset, a dataset function, a "
                             "generator or a PyDataset), before tfdist's own steps on them",
                             refused={PARAMETER_SERVER: _PS_KERAS_LOOP}),
    "sample_weight": Argument(TFDIST, "zipped with array `x` and `y` (a dataset carries its "
                              "own, as a third element)",
                              refused={PARAMETER_SERVER: _PS_KERAS_LOOP}),
    "initial_epoch": Argument(TFDIST, "the epoch training starts at; a backup's epoch when "
                              "one is resumed"),
    "steps_per_epoch": Argument(TFDIST, "steps in an epoch; default training.steps_per_epoch, "
                                "else the data's"),
    "validation_steps": Argument(KERAS, "batches of `validation_data` evaluated",
                                 refused={PARAMETER_SERVER: _PS_KERAS_LOOP}),
    "validation_batch_size": Argument(TFDIST, "the global batch of array validation data"),
    "validation_freq": Argument(KERAS, "evaluate every that many epochs",
                                refused={PARAMETER_SERVER: _PS_KERAS_LOOP}),
}

_PS_EVALUATION = ("the parameter-server chief evaluates with tfdist's own loop: it takes x, "
                  "y, batch_size, verbose and return_dict")

EVALUATE: dict[str, Argument] = {
    "x": Argument(TFDIST, "as `tfdist.fit`'s `train_data`"),
    "y": Argument(TFDIST, "the targets of array `x`"),
    "batch_size": Argument(TFDIST, "the global batch"),
    "verbose": Argument(KERAS, "Keras's progress output"),
    "sample_weight": Argument(TFDIST, "zipped with array `x` and `y`",
                              refused={PARAMETER_SERVER: _PS_EVALUATION}),
    "steps": Argument(KERAS, "batches evaluated (a call of the compiled steps never runs past "
                      "them)", refused={PARAMETER_SERVER: _PS_EVALUATION}),
    "callbacks": Argument(KERAS, "the user's callbacks",
                          refused={PARAMETER_SERVER: _PS_EVALUATION}),
    "return_dict": Argument(KERAS, "the results as a dict"),
    "kwargs": Argument(KERAS, "Keras's own (none documented)"),
}

_PS_PREDICTION = ("the parameter-server chief predicts with tfdist's own loop: it takes x, "
                  "batch_size and verbose")

PREDICT: dict[str, Argument] = {
    "x": Argument(TFDIST, "as `tfdist.fit`'s `train_data`"),
    "batch_size": Argument(TFDIST, "the global batch"),
    "verbose": Argument(KERAS, "Keras's progress output"),
    "steps": Argument(KERAS, "batches predicted", refused={PARAMETER_SERVER: _PS_PREDICTION}),
    "callbacks": Argument(KERAS, "the user's callbacks",
                          refused={PARAMETER_SERVER: _PS_PREDICTION}),
}

METHODS = {"fit": FIT, "evaluate": EVALUATE, "predict": PREDICT}


def refuse(method: str, given: Mapping[str, Any], path: str) -> None:
  """Raises `ConfigError` for the first argument in `given` that `path` refuses.

  Args:
    method: "fit", "evaluate" or "predict".
    given: the arguments the caller passed (those left at their default omitted).
    path: `SYNCHRONOUS` or `PARAMETER_SERVER`.
  """
  for name, value in given.items():
    if value is None:
      continue
    why = METHODS[method].get(name, Argument(KERAS, "")).refused.get(path)
    if why:
      raise ConfigError(f"is not honoured by {path}: {why}", key=name, received=value)


def split_validation(x, y, sample_weight, *, validation_split: float, validation_data):
  """Cuts `validation_split` off array training data, as Keras's `fit` does.

  Args:
    x: the training inputs.
    y: their targets, or None.
    sample_weight: their weights, or None.
    validation_split: the fraction (0 <= f < 1) of the last examples to hold out.
    validation_data: the caller's; when given, Keras ignores `validation_split`, and so does
      this.

  Returns:
    `(x, y, sample_weight, validation_data)`: the training part and the validation data
    (`(x, y)` or `(x, y, sample_weight)` of the held-out part).

  Raises:
    ConfigError: a split of anything but arrays, or a fraction out of range.

  Example:

  ```python
  x, y, w, validation = split_validation(np.ones((10, 2)), np.ones(10), None,
                                         validation_split=0.2, validation_data=None)
  len(x), len(validation[0])   # (8, 2)
  ```
  """
  if not validation_split or validation_data is not None:
    return x, y, sample_weight, validation_data
  from tfdist.training import data
  if not (isinstance(validation_split, (int, float)) and 0 < validation_split < 1):
    raise ConfigError("must be a fraction between 0 and 1 of the examples held out",
                      key="validation_split", received=validation_split)
  if not data.is_arrays(x):
    raise ConfigError("needs numpy arrays or tensors (Keras splits only those); hold out "
                      "your own validation_data for a dataset, dataset function or generator",
                      key="validation_split", received=type(x).__name__)
  from keras.src.trainers.data_adapters import array_slicing
  (x, y, sample_weight), held_out = array_slicing.train_validation_split(
      (x, y, sample_weight), validation_split=validation_split)
  return x, y, sample_weight, tuple(part for part in held_out if part is not None)


def markdown() -> str:
  """The docs' reference page of these tables (generated at every build, `docs/hooks.py`)."""
  lines = ["# Keras's fit, evaluate and predict arguments", "",
           "Every parameter of Keras's `Model.fit`, `Model.evaluate` and `Model.predict`, and "
           "what `tfdist.fit`, `tfdist.evaluate` and `tfdist.predict` do with it: applied by "
           "tfdist with Keras's meaning before it makes the dataset, or passed to Keras; and "
           "the paths that refuse it, in one line naming it. Generated from "
           "`tfdist.training.keras_arguments`; the tests read the installed Keras's "
           "signatures against it.", ""]
  for method, table in METHODS.items():
    lines += [f"## `Model.{method}`", "", "| argument | by | meaning | refused by |",
              "|---|---|---|---|"]
    for name, argument in table.items():
      refused = "; ".join(f"{path}: {why}" for path, why in argument.refused.items()) or "—"
      by = "tfdist" if argument.by == TFDIST else "Keras"
      lines.append(f"| `{name}` | {by} | {argument.meaning} | {refused} |")
    lines.append("")
  return "\n".join(lines)
