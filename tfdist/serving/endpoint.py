"""One served model as every protocol sees it: its name and version, the lookup each request
makes, its predictions through the shared batching queue, and the errors every protocol maps
to its own codes (HTTP status, gRPC status).

```python
endpoint = Endpoint(predictor, "digits", version=3)
endpoint.resolve("digits", "3")                      # NotFound for another name or version
outputs = await endpoint.predict({"x": rows})        # {output name: array}
```
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from typing import Callable

import grpc
import numpy as np
import tensorflow as tf

from tfdist.serving.batching import BatchingPredictor, DeadlineExceeded, QueueFull


class NotFound(LookupError):
  """Another model's name or version (HTTP 404, gRPC NOT_FOUND)."""


class SignatureNotFound(Exception):
  """A signature the model lacks: TensorFlow Serving's FAILED_PRECONDITION (HTTP 400)."""


class ModelRefused(ValueError):
  """The model refused a request's values (a token id past its vocabulary): HTTP 400, gRPC
  INVALID_ARGUMENT."""


def status(error: BaseException) -> tuple[int, grpc.StatusCode]:
  """The HTTP status and the gRPC status code of a request's `error`.

  A request larger than a batch is run in parts and answered whole, so a queue full is always
  of other callers' requests (429, RESOURCE_EXHAUSTED: retry later).
  """
  for kind, codes in ((NotFound, (404, grpc.StatusCode.NOT_FOUND)),
                      (SignatureNotFound, (400, grpc.StatusCode.FAILED_PRECONDITION)),
                      (QueueFull, (429, grpc.StatusCode.RESOURCE_EXHAUSTED)),
                      (DeadlineExceeded, (504, grpc.StatusCode.DEADLINE_EXCEEDED)),
                      (ValueError, (400, grpc.StatusCode.INVALID_ARGUMENT))):
    if isinstance(error, kind):
      return codes
  return 500, grpc.StatusCode.INTERNAL


@dataclasses.dataclass(frozen=True)
class Endpoint:
  """A model served under `name`, version `version`, through `predictor`.

  Args:
    predictor: the batching predictor every protocol shares.
    name: the model's name.
    version: its version (TensorFlow Serving's newest version folder; 1 otherwise).
  """
  predictor: BatchingPredictor
  name: str
  version: int = 1

  @property
  def model(self):
    """The `ServedModel`: its inputs and outputs."""
    return self.predictor.model

  def resolve(self, name: str, version: str | int | None = None,
              fields: tuple[str, str] | None = None) -> None:
    """Checks a request is for this model; `version` None or "" means the newest.

    Args:
      name, version: what the request asked for.
      fields: the request's fields holding them (gRPC's `model_spec.name`...), named in the
        error; None for a URL's path.

    Raises:
      NotFound: another name or version, naming what this server serves.
    """
    said = [f"{field}: " for field in fields] if fields else ["", ""]
    if name != self.name:
      raise NotFound(f"{said[0]}no model named {name!r}; this server serves {self.name!r}")
    if version not in (None, "") and str(version) != str(self.version):
      raise NotFound(f"{said[1]}model {self.name!r} has no version {str(version)!r}; this "
                     f"server serves version {self.version}")

  def _require_dtypes(self, inputs: dict, spelled: Callable[[str], str]) -> None:
    """Each typed input of its input's dtype (unknown names are the model check's)."""
    for info in self.model.inputs:
      if info.name in inputs:
        got = _received_dtype(np.asarray(inputs[info.name]))
        if got != info.dtype:
          raise ValueError(f"inputs[{info.name!r}]: expected {spelled(info.dtype)}. "
                           f"Received: {spelled(got)}")

  def output_names(self, asked=None) -> list[str]:
    """The outputs a request asked for (all when `asked` is empty), in the model's order.

    Raises:
      ValueError: a name that is not an output.
    """
    names = [o.name for o in self.model.outputs]
    unknown = [n for n in asked or () if n not in names]
    if unknown:
      raise ValueError(f"outputs: expected names among {names}. Received: {unknown}")
    return [n for n in names if not asked or n in asked]

  async def predict(self, inputs, timeout: float | None = None,
                    spelled: Callable[[str], str] | None = None) -> dict:
    """The outputs of `inputs` (arrays by input name, or one array), by output name, through
    the batching queue; cancelled with the caller.

    Args:
      inputs: arrays by input name, or one array.
      timeout: seconds the request may wait to run.
      spelled: for a typed request (a TensorProto's dtype, KServe V2's datatype), how its
        protocol spells a TensorFlow dtype: each input must then be of its input's dtype
        exactly, as TensorFlow Serving and Triton refuse another ("Expects arg[0] to be float
        but int64 is provided"); None: untyped values (JSON numbers) converted.

    Returns:
      The outputs, by output name.

    Raises:
      ValueError: inputs of the wrong names, shape or dtype.
      ModelRefused: the model refused the values.
      QueueFull, DeadlineExceeded: the batching predictor's.

    Example:

    ```python
    outputs = await endpoint.predict({"x": rows}, spelled=tensors.datatype)   # KServe V2
    ```
    """
    if spelled is not None and isinstance(inputs, dict):
      self._require_dtypes(inputs, spelled)
    future = self.predictor.submit(inputs, timeout=timeout)
    try:
      outputs = await asyncio.wrap_future(future)
    except tf.errors.InvalidArgumentError as e:
      raise ModelRefused(f"the model refused the request: {model_error(e.message)}") from None
    except asyncio.CancelledError:
      future.cancel()  # The client went away: never run it.
      raise
    if not isinstance(outputs, dict):
      outputs = {self.model.outputs[0].name: outputs}
    return outputs


def _received_dtype(array: np.ndarray) -> str:
  return "string" if array.dtype.kind in "OSU" else tf.as_dtype(array.dtype).name


def decode_json(body: bytes):
  """A request body's JSON document.

  Raises:
    ValueError: not JSON, not UTF-8, or nested past what the decoder can follow (a body, not a
      fault of the server: 400).
  """
  try:
    return json.loads(body)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"the body is not JSON ({e})") from None
  except RecursionError:
    raise ValueError("the body is nested too deeply for the JSON decoder (about 1,000 levels "
                     "at most)") from None


def model_error(message: str) -> str:
  """The line of a TensorFlow error message that says what was wrong, without the graph's
  traceback: "indices[0,7] = 99 is not in [0, 50)". Pure.

  >>> model_error("Graph execution error:\\n\\nDetected at node x defined at (most recent "
  ...             "call last):\\n  File a.py\\n\\nindices[0,7] = 99 is not in [0, 50)\\n\\t [[{{node g}}]]")
  'indices[0,7] = 99 is not in [0, 50)'
  """
  lines = [re.sub(r"\{\{function_node [^}]*\}\}\s*", "", line) for line in message.splitlines()]
  said = [line.strip() for line in lines if line.strip() and not line[0].isspace() and
          not line.startswith(("[[", "Graph execution error", "Detected at node"))]
  return said[-1] if said else message.strip().splitlines()[0]
