"""A model endpoint over HTTP with TensorFlow Serving's REST surface, on aiohttp.

  GET  /v1/models/NAME[/versions/N]            status
  GET  /v1/models/NAME[/versions/N]/metadata   inputs and outputs (names, dtypes, shapes)
  POST /v1/models/NAME[/versions/N]:predict    {"instances": [...]} -> {"predictions": [...]},
                                  {"inputs": ...} -> {"outputs": ...}, or a `.npy` body
                                  (Content-Type: application/x-npy) -> a `.npy` answer
  GET  /healthz                   200 once the model is warm
  GET  /metrics                   the batching predictor's counters and the responses by
                                  status code, Prometheus text format

Rows (`instances`) are values of the one input, or objects by input name (any number of
inputs); strings are JSON strings. Every error is `{"error": "..."}`: 400 for a wrong shape,
dtype or body, or a request the model refuses (a token id past the vocabulary), 404 for another
model's name or version, 413 for a body over the limit, 429 with Retry-After when the queue is
full, 504 when a request's deadline (header `X-Timeout-Ms`) passed before it ran, 500 for a
fault of the server. A client that goes away cancels its request. Bound to 127.0.0.1 unless
told otherwise.
"""

from __future__ import annotations

import asyncio
import collections
import io
import json
import logging
import re

import numpy as np
import tensorflow as tf
from aiohttp import web

from tfdist.serving.batching import BatchingPredictor, DeadlineExceeded, QueueFull

NPY = "application/x-npy"


def make_app(predictor: BatchingPredictor, name: str, *, max_body_bytes: int,
             version: int = 1) -> web.Application:
  """The aiohttp application serving `predictor` as model `name`, version `version`.

  Args:
    predictor: the batching predictor of the model.
    name: the model's name in the URLs.
    max_body_bytes: the largest request body; beyond it 413.
    version: the version served (TensorFlow Serving's newest version folder).

  Returns:
    The `aiohttp.web.Application`; `app[RESPONSES]` counts responses by status code.
  """
  responses = collections.Counter()
  app = web.Application(client_max_size=max_body_bytes,
                        middlewares=[_counted(responses), _json_errors])
  app[RESPONSES] = responses

  def mine(request):
    if request.match_info["name"] != name:
      _not_found(f"no model named {request.match_info['name']!r}; this server serves "
              f"{name!r}")
    asked = request.match_info.get("version")
    if asked is not None and asked != str(version):
      _not_found(f"model {name!r} has no version {asked!r}; this server serves version "
              f"{version}")

  async def status(request):
    mine(request)
    return web.json_response({"model_version_status": [
        {"version": str(version), "state": "AVAILABLE",
         "status": {"error_code": "OK", "error_message": ""}}]})

  async def metadata(request):
    mine(request)
    served = predictor.model

    def infos(items):
      return {i.name: {"dtype": i.dtype, "shape": [-1, *(-1 if s is None else s
                                                         for s in i.shape)]} for i in items}
    return web.json_response({"model_spec": {"name": name, "version": str(version),
                                             "signature_name": "serving_default"},
                              "metadata": {"signature_def": {"serving_default": {
                                  "inputs": infos(served.inputs),
                                  "outputs": infos(served.outputs)}}}})

  async def predict(request):
    mine(request)
    timeout = request.headers.get("X-Timeout-Ms")
    try:
      timeout = None if timeout is None else float(timeout) / 1000
    except ValueError:
      return _error(400, f"X-Timeout-Ms: must be a number of milliseconds. Received: {timeout!r}")
    body = await request.read()
    binary = request.content_type == NPY
    try:
      inputs, row_format = (_from_npy(body), False) if binary else _from_json(body, predictor)
      future = predictor.submit(inputs, timeout=timeout)
    except ValueError as e:
      return _error(400, str(e))
    except QueueFull as e:
      return _error(429, f"{e}: retry later", headers={"Retry-After": "1"})
    try:
      outputs = await asyncio.wrap_future(future)
    except DeadlineExceeded as e:
      return _error(504, str(e))
    except tf.errors.InvalidArgumentError as e:  # The model refused this request's values.
      return _error(400, f"the model refused the request: {model_error(e.message)}")
    except asyncio.CancelledError:
      future.cancel()  # The client went away: never run it.
      raise
    if binary:
      if isinstance(outputs, dict):
        return _error(400, "a .npy answer holds one output; this model has "
                      f"{len(outputs)}: send JSON")
      buffer = io.BytesIO()
      np.save(buffer, outputs)
      return web.Response(body=buffer.getvalue(), content_type=NPY)
    return web.json_response(_to_json(outputs, row_format))

  async def health(_request):
    return web.Response(text="ok")

  async def metrics(_request):
    from tfdist.serving import metrics as prometheus
    return web.Response(body=prometheus.text(predictor.stats, name, responses),
                        content_type="text/plain", charset="utf-8")

  for model in ("/v1/models/{name:[^/:]+}", "/v1/models/{name:[^/:]+}/versions/{version:[^/:]+}"):
    app.add_routes([web.get(model, status), web.get(model + "/metadata", metadata),
                    web.post(model + ":predict", predict)])
  app.add_routes([web.get("/healthz", health), web.get("/metrics", metrics)])
  return app


RESPONSES = web.AppKey("responses", collections.Counter)


def _counted(responses: collections.Counter):
  @web.middleware
  async def count(request, handler):
    response = await handler(request)  # _json_errors (inside) answers every error.
    responses[response.status] += 1
    return response
  return count


@web.middleware
async def _json_errors(request, handler):
  try:
    return await handler(request)
  except web.HTTPException as e:
    if e.content_type == "application/json":
      return web.Response(status=e.status, text=e.text, content_type="application/json",
                          headers={k: v for k, v in e.headers.items()
                                   if k.lower() not in ("content-type", "content-length")})
    if isinstance(e, web.HTTPRequestEntityTooLarge):
      return _error(413, f"the body is over the limit of {request._client_max_size} bytes; "
                    "send fewer rows per request")
    return _error(e.status, e.reason)
  except asyncio.CancelledError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    logging.exception("tfdist model-server: %s %s failed", request.method, request.path)
    first = str(e).splitlines()[0] if str(e) else ""
    return _error(500, f"the server failed: {type(e).__name__}: {first}")


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


def _not_found(message: str):
  raise web.HTTPNotFound(text=json.dumps({"error": message}), content_type="application/json")


def _error(status: int, message: str, headers=None) -> web.Response:
  return web.json_response({"error": message}, status=status, headers=headers)


def _from_json(body: bytes, predictor: BatchingPredictor):
  """(the inputs, whether the request was in the row format) of a JSON body."""
  try:
    document = json.loads(body)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"the body is not JSON ({e})") from None
  if not isinstance(document, dict) or len({"instances", "inputs"} & set(document)) != 1:
    raise ValueError('the body must be an object with "instances" (rows) or "inputs" '
                     f"(columns). Received: {_keys(document)}")
  if "inputs" in document:
    return document["inputs"], False
  instances = document["instances"]
  if not isinstance(instances, list) or not instances:
    raise ValueError('"instances" must be a non-empty list of rows')
  names = [i.name for i in predictor.model.inputs]
  objects = [isinstance(row, dict) for row in instances]
  if len(names) > 1 and not all(objects):
    raise ValueError(f'"instances": each row must be an object with the inputs {names}')
  if any(objects):  # Each row an object by input name (TensorFlow Serving's named rows).
    wrong = [row for row in instances if not isinstance(row, dict) or sorted(row) != sorted(names)]
    if wrong:
      raise ValueError(f'"instances": each row must be an object with the keys {names}. '
                       f"Received: {_keys(wrong[0])}")
    return {n: [row[n] for row in instances] for n in names}, True
  return instances, True


def _to_json(outputs, rows: bool) -> dict:
  if not rows:
    return {"outputs": {k: _listed(v) for k, v in outputs.items()} if isinstance(outputs, dict)
            else _listed(outputs)}
  if isinstance(outputs, dict):
    count = len(next(iter(outputs.values())))
    return {"predictions": [{k: _listed(v[i]) for k, v in outputs.items()}
                            for i in range(count)]}
  return {"predictions": _listed(outputs)}


def _listed(array):
  """An output as JSON values: string outputs (bytes) as text."""
  array = np.asarray(array)
  if array.dtype == object:
    return np.vectorize(lambda v: v.decode(errors="replace") if isinstance(v, bytes) else v,
                        otypes=[object])(array).tolist()
  return array.tolist()


def _from_npy(body: bytes) -> np.ndarray:
  try:
    return np.load(io.BytesIO(body), allow_pickle=False)
  except (ValueError, OSError) as e:
    raise ValueError(f"the body is not a .npy array ({e})") from None


def _keys(document) -> str:
  if isinstance(document, dict):
    return repr(sorted(document)) if document else "an empty object {}"
  return type(document).__name__


async def serve(predictor: BatchingPredictor, name: str, *, host: str, port: int,
                max_body_bytes: int, version: int = 1, on_ready=None) -> None:
  """Serves until cancelled; `on_ready(url)` once listening."""
  runner = web.AppRunner(make_app(predictor, name, max_body_bytes=max_body_bytes,
                                  version=version),
                         handler_cancellation=True, access_log=None)
  await runner.setup()
  site = web.TCPSite(runner, host, port, backlog=1024)
  await site.start()
  bound = site._server.sockets[0].getsockname()[1]  # The port, when 0 asked for a free one.
  if on_ready:
    on_ready(f"http://{host}:{bound}/v1/models/{name}")
  try:
    await asyncio.Event().wait()
  finally:
    await runner.cleanup()
