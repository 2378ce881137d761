"""KServe V2 (the Open Inference Protocol of KServe, Triton and Seldon MLServer) over HTTP:

  GET  /v2                                        the server's name, version, extensions
  GET  /v2/health/live, /v2/health/ready          200 while serving
  GET  /v2/models/M[/versions/V]                  the model's inputs and outputs
  GET  /v2/models/M[/versions/V]/ready            200 when it is served
  POST /v2/models/M[/versions/V]/infer            tensors in, tensors out

A tensor is `{"name", "datatype" (FP32, INT64, BYTES, ...), "shape", "data"}` (data flat or
nested, row-major); with the binary tensor data extension (header
`Inference-Header-Content-Length`) an input's bytes follow the JSON and an output asked with
`"binary_data": true` (or the request's `"binary_data_output": true`) comes back the same way,
as Triton's `tritonclient` sends and asks by default. The gRPC side of the protocol is
`grpc_services.py`; both share `metadata` and `output_tensor`.

```python
app.add_routes(kserve.routes(endpoint))
```
"""

from __future__ import annotations

import json

from aiohttp import web

from tfdist.serving import tensors
from tfdist.serving.endpoint import Endpoint, decode_json

HEADER_LENGTH = "Inference-Header-Content-Length"
EXTENSIONS = ["binary_tensor_data"]


def server_metadata() -> dict:
  """The server's name, version and the protocol extensions it speaks."""
  from importlib import metadata
  try:
    version = metadata.version("tfdist")
  except metadata.PackageNotFoundError:  # A checkout on PYTHONPATH, not installed.
    version = "unknown"
  return {"name": "tfdist", "version": version, "extensions": EXTENSIONS}


def metadata(endpoint: Endpoint) -> dict:
  """The model's metadata: name, versions, platform, and each input's and output's name,
  datatype and shape (-1 for the rows and any size left open)."""
  def described(infos):
    return [{"name": i.name, "datatype": tensors.datatype(i.dtype),
             "shape": [-1, *(-1 if s is None else s for s in i.shape)]} for i in infos]
  return {"name": endpoint.name, "versions": [str(endpoint.version)],
          "platform": endpoint.model.platform, "inputs": described(endpoint.model.inputs),
          "outputs": described(endpoint.model.outputs)}


def routes(endpoint: Endpoint) -> list:
  """The aiohttp routes of KServe V2 for `endpoint`."""
  async def server(_request):
    return web.json_response(server_metadata())

  async def live(_request):
    return web.json_response({"live": True})

  async def ready(_request):
    return web.json_response({"ready": True})

  def resolve(request):
    endpoint.resolve(request.match_info["name"], request.match_info.get("version"))

  async def model(request):
    resolve(request)
    return web.json_response(metadata(endpoint))

  async def model_ready(request):
    resolve(request)
    return web.json_response({"name": endpoint.name, "ready": True})

  async def infer(request):
    resolve(request)
    header, inputs, binary = _decode(await request.read(), request.headers.get(HEADER_LENGTH))
    named = {}
    for i, tensor in enumerate(inputs):
      name, array = _input(tensor, binary, i)
      if name in named:
        raise ValueError(f"inputs[{i}].name: each input once. Received {name!r} twice")
      named[name] = array
    if binary.remaining:
      raise ValueError(f"the binary data holds {binary.remaining} bytes past its inputs'")
    asked, unlisted_binary = _asked_outputs(header)
    names = endpoint.output_names(list(asked))
    # Its names checked by the served model; each datatype the input's, as Triton checks.
    outputs = await endpoint.predict(named, spelled=tensors.datatype)
    return _answer(endpoint, header, names, outputs,
                   {name: asked.get(name, unlisted_binary) for name in names})

  out = [web.get("/v2", server), web.get("/v2/health/live", live),
         web.get("/v2/health/ready", ready)]
  for base in ("/v2/models/{name:[^/]+}", "/v2/models/{name:[^/]+}/versions/{version:[^/]+}"):
    out += [web.get(base, model), web.get(base + "/ready", model_ready),
            web.post(base + "/infer", infer)]
  return out


class _Binary:
  """The bytes after a request's JSON, handed to the inputs that declare a size, in order."""

  def __init__(self, data: bytes):
    self.data, self.at = data, 0

  def take(self, size, where: str) -> bytes:
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
      raise ValueError(f"{where}.parameters.binary_data_size: expected a size in bytes. "
                       f"Received: {size!r}")
    if self.at + size > len(self.data):
      raise ValueError(f"{where}.parameters.binary_data_size: {size} bytes, but only "
                       f"{len(self.data) - self.at} remain in the body")
    self.at += size
    return self.data[self.at - size:self.at]

  @property
  def remaining(self) -> int:
    return len(self.data) - self.at


def _decode(body: bytes, header_length) -> tuple[dict, list, _Binary]:
  """(the request's JSON object, its inputs, the binary data after the JSON)."""
  if header_length is None:
    header, rest = body, b""
  else:
    try:
      length = int(header_length)
    except ValueError:
      length = -1
    if not 0 <= length <= len(body):
      raise ValueError(f"{HEADER_LENGTH}: expected the JSON's length, at most the body's "
                       f"{len(body)} bytes. Received: {header_length!r}")
    header, rest = body[:length], body[length:]
  document = decode_json(header)
  if not isinstance(document, dict) or not isinstance(document.get("inputs"), list) or \
      not document["inputs"]:
    raise ValueError('the body must be an object with "inputs": a non-empty list of tensors '
                     '({"name", "shape", "datatype", "data"})')
  return document, document["inputs"], _Binary(rest)


def _input(tensor, binary: _Binary, i: int):
  where = f"inputs[{i}]"
  if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
    raise ValueError(f"{where}: expected an object with a name, shape, datatype and data")
  for key in ("shape", "datatype"):
    if key not in tensor:
      raise ValueError(f"{where}.{key}: is required")
  size = (tensor.get("parameters") or {}).get("binary_data_size")
  if size is not None:
    raw = binary.take(size, where)
    return tensor["name"], tensors.from_raw(raw, tensor["datatype"], tensor["shape"], where)
  if "data" not in tensor:
    raise ValueError(f"{where}.data: is required (or parameters.binary_data_size with the "
                     "binary tensor data extension)")
  return tensor["name"], tensors.shaped(tensor["data"], tensor["datatype"], tensor["shape"],
                                        where)


def _asked_outputs(header: dict) -> tuple[dict, bool]:
  """({output name: whether it is asked in binary} of the request's "outputs" (empty: all),
  whether an output not listed comes in binary: the request's "binary_data_output")."""
  asked = header.get("outputs") or []
  if not isinstance(asked, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str)
                                            for o in asked):
    raise ValueError('outputs: expected a list of objects with a "name"')
  default = bool((header.get("parameters") or {}).get("binary_data_output", False))
  return {o["name"]: bool((o.get("parameters") or {}).get("binary_data", default))
          for o in asked}, default


def output_tensor(endpoint: Endpoint, name: str, array) -> dict:
  """An output's name, KServe V2 datatype and shape, as both sides of the protocol answer."""
  info = next(o for o in endpoint.model.outputs if o.name == name)
  return {"name": name, "datatype": tensors.datatype(info.dtype), "shape": list(array.shape)}


def _answer(endpoint: Endpoint, header: dict, names: list, outputs: dict,
            binary: dict) -> web.Response:
  """The infer answer: each output in JSON, or in the binary data after it where `binary`
  says so."""
  described, chunks = [], []
  for name in names:
    tensor = output_tensor(endpoint, name, outputs[name])
    if binary[name]:
      raw = tensors.to_raw(outputs[name])
      tensor["parameters"] = {"binary_data_size": len(raw)}
      chunks.append(raw)
    else:
      tensor["data"] = tensors.json_values(outputs[name])
    described.append(tensor)
  document = {"model_name": endpoint.name, "model_version": str(endpoint.version),
              "outputs": described}
  if "id" in header:
    document["id"] = header["id"]
  text = json.dumps(document).encode()
  if not chunks:
    return web.Response(body=text, content_type="application/json")
  return web.Response(body=text + b"".join(chunks), content_type="application/octet-stream",
                      headers={HEADER_LENGTH: str(len(text))})
