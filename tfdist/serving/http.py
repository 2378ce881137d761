"""A model endpoint over HTTP with TensorFlow Serving's REST surface, on aiohttp.

  GET  /v1/models/NAME            status
  GET  /v1/models/NAME/metadata   inputs and outputs (names, dtypes, shapes)
  POST /v1/models/NAME:predict    {"instances": [...]} -> {"predictions": [...]},
                                  {"inputs": ...} -> {"outputs": ...}, or a `.npy` body
                                  (Content-Type: application/x-npy) -> a `.npy` answer
  GET  /healthz                   200 once the model is warm
  GET  /metrics                   the batching predictor's counters, Prometheus text format

Errors are `{"error": "..."}`: 400 for a wrong shape, dtype or body, 404 for another model's
name, 413 for a body over the limit, 429 with Retry-After when the queue is full, 504 when a
request's deadline (header `X-Timeout-Ms`) passed before it ran. A client that goes away
cancels its request. Bound to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import asyncio
import io
import json

import numpy as np
from aiohttp import web

from tfdist.serving.batching import BatchingPredictor, DeadlineExceeded, QueueFull

NPY = "application/x-npy"


def make_app(predictor: BatchingPredictor, name: str, *, max_body_bytes: int) -> web.Application:
  """The aiohttp application serving `predictor` as model `name`."""
  app = web.Application(client_max_size=max_body_bytes, middlewares=[_json_errors])
  model = "/v1/models/{name:[^/:]+}"

  def mine(request):
    if request.match_info["name"] != name:
      raise web.HTTPNotFound(text=json.dumps({"error": f"no model named "
                                               f"{request.match_info['name']!r}; this server "
                                               f"serves {name!r}"}),
                             content_type="application/json")

  async def status(request):
    mine(request)
    return web.json_response({"model_version_status": [
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK",
                                                          "error_message": ""}}]})

  async def metadata(request):
    mine(request)
    served = predictor.model

    def infos(items):
      return {i.name: {"dtype": i.dtype, "shape": [-1, *(-1 if s is None else s
                                                         for s in i.shape)]} for i in items}
    return web.json_response({"model_spec": {"name": name, "version": "1",
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
    return web.Response(body=prometheus.text(predictor.stats, name),
                        content_type="text/plain", charset="utf-8")

  app.add_routes([web.get(model, status), web.get(model + "/metadata", metadata),
                  web.post(model + ":predict", predict), web.get("/healthz", health),
                  web.get("/metrics", metrics)])
  return app


@web.middleware
async def _json_errors(request, handler):
  try:
    return await handler(request)
  except web.HTTPException as e:
    if e.content_type == "application/json":
      raise
    if isinstance(e, web.HTTPRequestEntityTooLarge):
      return _error(413, f"the body is over the limit of {request._client_max_size} bytes; "
                    "send fewer rows per request")
    return _error(e.status, e.reason)


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
  if len(names) > 1:  # Each row an object of the inputs.
    if not all(isinstance(row, dict) for row in instances):
      raise ValueError(f'"instances": each row must be an object with the inputs {names}')
    return {n: [row.get(n) for row in instances] for n in names}, True
  return instances, True


def _to_json(outputs, rows: bool) -> dict:
  if not rows:
    return {"outputs": {k: v.tolist() for k, v in outputs.items()} if isinstance(outputs, dict)
            else outputs.tolist()}
  if isinstance(outputs, dict):
    count = len(next(iter(outputs.values())))
    return {"predictions": [{k: v[i].tolist() for k, v in outputs.items()}
                            for i in range(count)]}
  return {"predictions": outputs.tolist()}


def _from_npy(body: bytes) -> np.ndarray:
  try:
    return np.load(io.BytesIO(body), allow_pickle=False)
  except (ValueError, OSError) as e:
    raise ValueError(f"the body is not a .npy array ({e})") from None


def _keys(document) -> str:
  return repr(sorted(document)) if isinstance(document, dict) else type(document).__name__


async def serve(predictor: BatchingPredictor, name: str, *, host: str, port: int,
                max_body_bytes: int, on_ready=None) -> None:
  """Serves until cancelled; `on_ready(url)` once listening."""
  runner = web.AppRunner(make_app(predictor, name, max_body_bytes=max_body_bytes),
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
