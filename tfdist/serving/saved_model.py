"""`tfdist model-export MODEL OUT_DIR`: a SavedModel for TensorFlow Serving (or
`tfdist model-server`) with stable input and output names, and the matching
`batching_parameters.txt`, checked by loading it back.

  OUT_DIR/1/                     the SavedModel (version 1), signature `serving_default`:
                                 inputs named as the model's inputs, outputs as its outputs
  OUT_DIR/batching_parameters.txt  for `tensorflow_model_server --enable_batching
                                 --batching_parameters_file=...`

```python
export_for_serving("model.keras", "exported/digits", max_batch_size=32, max_wait_ms=2)
```
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf


def export_for_serving(model, out_dir: str, *, max_batch_size: int = 32,
                       max_wait_ms: float = 2.0, tolerance: float = 1e-5) -> str:
  """Writes a SavedModel for TensorFlow Serving (`tfdist model-export`), with the batching
  parameters that batch as tfdist's `BatchingPredictor` does, and checks it reloads to the same
  outputs.

  Args:
    model: a Keras model or a `.keras` file.
    out_dir: the model's base directory: the SavedModel is version `1` in it, beside
      `batching_parameters.txt` (`tensorflow_model_server --enable_batching
      --batching_parameters_file=...`).
    max_batch_size: rows per batch at most.
    max_wait_ms: how long a batch may wait for more requests.
    tolerance: the largest difference allowed between the reloaded SavedModel's outputs and
      the model's.

  Returns:
    The SavedModel's directory (`out_dir/1`).

  Raises:
    ValueError: the reloaded SavedModel's outputs differ from the model's by over
      `tolerance`, or the model has no known inputs.

  Example:

  ```python
  import keras
  from tfdist.serving import export_for_serving
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
  saved = export_for_serving(model, "served/regressor", max_batch_size=64)
  print(saved)   # served/regressor/1
  ```
  """
  import keras

  from tfdist.serving.model import ServedModel

  keras_model = keras.models.load_model(model) if isinstance(model, (str, os.PathLike)) \
      else model
  served = ServedModel(keras_model)  # Checks the model has known inputs, and names them.
  specs = [tf.TensorSpec((None, *i.shape), i.dtype, name=i.name) for i in served.inputs]
  names = [o.name for o in served.outputs]

  def serving_default(*tensors):
    x = tensors[0] if len(tensors) == 1 else list(tensors)
    outputs = tf.nest.flatten(keras_model(x, training=False))
    return dict(zip(names, outputs))

  archive = keras.export.ExportArchive()
  archive.track(keras_model)
  archive.add_endpoint("serving_default", serving_default, input_signature=specs)
  saved = os.path.join(out_dir, "1")
  archive.write_out(saved, verbose=False)
  with open(os.path.join(out_dir, "batching_parameters.txt"), "w") as f:
    f.write(batching_parameters(max_batch_size, max_wait_ms))
  _check(saved, served, tolerance)
  return saved


def batching_parameters(max_batch_size: int, max_wait_ms: float, threads: int | None = None
                        ) -> str:
  """TensorFlow Serving's batching parameters (text protobuf) for the same batching as
  tfdist's predictor: allowed sizes the powers of 2 up to the maximum. Pure.

  >>> print(batching_parameters(8, 2, threads=2), end="")
  max_batch_size { value: 8 }
  batch_timeout_micros { value: 2000 }
  max_enqueued_batches { value: 100 }
  num_batch_threads { value: 2 }
  allowed_batch_sizes: 1
  allowed_batch_sizes: 2
  allowed_batch_sizes: 4
  allowed_batch_sizes: 8
  pad_variable_length_inputs: false
  """
  sizes = [2 ** i for i in range(max_batch_size.bit_length()) if 2 ** i < max_batch_size]
  lines = [f"max_batch_size {{ value: {max_batch_size} }}",
           f"batch_timeout_micros {{ value: {int(max_wait_ms * 1000)} }}",
           "max_enqueued_batches { value: 100 }",
           f"num_batch_threads {{ value: {threads or os.cpu_count() or 1} }}"]
  lines += [f"allowed_batch_sizes: {s}" for s in [*sizes, max_batch_size]]
  lines.append("pad_variable_length_inputs: false")
  return "\n".join(lines) + "\n"


def _check(saved: str, served, tolerance: float) -> None:
  from tfdist.serving.model import ServedModel, example_rows

  reloaded = ServedModel(saved)
  if [i.name for i in reloaded.inputs] != [i.name for i in served.inputs]:
    raise ValueError(f"the SavedModel's inputs are {[i.name for i in reloaded.inputs]}, not "
                     f"the model's {[i.name for i in served.inputs]}")
  rng = np.random.default_rng(0)
  rows = [example_rows(i, 4, rng) for i in served.inputs]
  expected, got = served.run(rows, 4), reloaded.run(rows, 4)
  names = [o.name for o in served.outputs]
  expected = expected if isinstance(expected, dict) else {names[0]: expected}
  got = got if isinstance(got, dict) else {reloaded.outputs[0].name: got}
  if sorted(got) != sorted(expected):
    raise ValueError(f"the SavedModel's outputs are {sorted(got)}, not {sorted(expected)}")
  for name, value in expected.items():
    numeric = value.dtype.kind in "biuf"
    if (np.abs(value - got[name]).max() > tolerance) if numeric else \
        not np.array_equal(value, got[name]):
      raise ValueError(f"the reloaded SavedModel's output {name} differs from the model's by "
                       f"over {tolerance}")
