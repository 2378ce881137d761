"""The model over gRPC, beside HTTP in the same process and event loop, through the same
batching queue: TensorFlow Serving's `tensorflow.serving.PredictionService` (Predict,
GetModelMetadata; Classify, Regress and MultiInference answered as TensorFlow Serving answers a
model without those signatures) and `ModelService.GetModelStatus`, from the
`tensorflow-serving-api` package's own protos; and KServe V2's `inference.GRPCInferenceService`
(ServerLive, ServerReady, ModelReady, ServerMetadata, ModelMetadata, ModelInfer) from Triton's
own protos (`tritonclient`'s `grpc_service.proto`, of which KServe's `grpc_predict_v2.proto` is
the part these methods use; the rest answer UNIMPLEMENTED).

Errors are gRPC status codes with a message naming the field: NOT_FOUND (another model or
version), INVALID_ARGUMENT (a wrong name, dtype, shape or value), RESOURCE_EXHAUSTED (the queue
full of other callers' requests, or a message over the size limit), DEADLINE_EXCEEDED (the
call's deadline passed before it ran), FAILED_PRECONDITION (another signature, as TensorFlow
Serving says).

```python
server = await grpc_services.start(endpoint, host="127.0.0.1", port=8500,
                                   max_message_bytes=64 << 20)
await server.wait_for_termination()
```
"""

from __future__ import annotations

import functools

import numpy as np

import grpc
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2, types_pb2
from tensorflow_serving.apis import (get_model_metadata_pb2, get_model_status_pb2,
                                     model_service_pb2_grpc, predict_pb2,
                                     prediction_service_pb2_grpc)
from tritonclient.grpc import service_pb2 as kserve_pb2
from tritonclient.grpc import service_pb2_grpc as kserve_grpc

from tfdist.serving import kserve, tensors
from tfdist.serving.endpoint import Endpoint, SignatureNotFound, status
from tfdist.serving.signature import PREDICT_METHOD, SERVING_DEFAULT, signature_def

_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
             "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
             "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
             "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents"}
"""The `InferTensorContents` field holding each KServe V2 datatype's values (FP16: raw only)."""
_SPEC = ("model_spec.name", "model_spec.version")


async def start(endpoint: Endpoint, *, host: str, port: int,
                max_message_bytes: int) -> tuple[grpc.aio.Server, int]:
  """Starts the gRPC server of `endpoint` on this event loop.

  Args:
    endpoint: the served model, shared with HTTP.
    host: the address to listen on.
    port: the port; 0 for a free one.
    max_message_bytes: the largest request; beyond it RESOURCE_EXHAUSTED.

  Returns:
    (the started `grpc.aio.Server`, the port it listens on).

  Raises:
    RuntimeError: the port could not be bound.
  """
  server = grpc.aio.server(options=[("grpc.max_receive_message_length", max_message_bytes),
                                    ("grpc.max_send_message_length", -1)])
  prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
      PredictionService(endpoint), server)
  model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelService(endpoint), server)
  kserve_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceService(endpoint), server)
  bound = server.add_insecure_port(f"{host}:{port}")
  if not bound:
    raise RuntimeError(f"--grpc-port: cannot listen on {host}:{port}")
  await server.start()
  return server, bound


def _answered(method):
  """Answers a servicer method's errors with their gRPC status and message."""
  @functools.wraps(method)
  async def answer(self, request, context):
    try:
      return await method(self, request, context)
    except grpc.aio.AbortError:
      raise
    except Exception as e:  # pylint: disable=broad-except
      code = status(e)[1]
      message = str(e) if code != grpc.StatusCode.INTERNAL else \
          f"the server failed: {type(e).__name__}: {e}"
      await context.abort(code, message)
  return answer


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
  """TensorFlow Serving's PredictionService for `endpoint`."""

  def __init__(self, endpoint: Endpoint):
    self.endpoint = endpoint

  def _resolve(self, spec) -> None:
    if spec.version_label:
      self.endpoint.resolve(spec.name, fields=_SPEC)
      raise ValueError(f"model_spec.version_label: this server has no labels; give "
                       f"model_spec.version {self.endpoint.version}. Received: "
                       f"{spec.version_label!r}")
    self.endpoint.resolve(spec.name, spec.version.value if spec.HasField("version") else None,
                          _SPEC)

  def _spec(self, spec):
    answer = type(spec)(name=self.endpoint.name, signature_name=SERVING_DEFAULT)
    answer.version.value = self.endpoint.version
    return answer

  @_answered
  async def Predict(self, request, context):
    self._resolve(request.model_spec)
    _require_signature(request.model_spec.signature_name)
    inputs = {}
    for name, proto in request.inputs.items():
      try:
        inputs[name] = tf.make_ndarray(proto)
      except Exception as e:  # pylint: disable=broad-except
        raise ValueError(f"inputs[{name!r}]: not a readable TensorProto ({e})") from None
    names = self.endpoint.output_names(list(request.output_filter))
    outputs = await self.endpoint.predict(inputs, timeout=context.time_remaining(),
                                          spelled=_data_type)
    return predict_pb2.PredictResponse(
        model_spec=self._spec(request.model_spec),
        outputs={n: _typed_proto(outputs[n]) for n in names})

  @_answered
  async def GetModelMetadata(self, request, context):
    self._resolve(request.model_spec)
    fields = list(request.metadata_field)
    if not fields:
      raise ValueError("metadata_field: GetModelMetadataRequest must specify at least one "
                       "metadata_field (signature_def)")
    unknown = [f for f in fields if f != "signature_def"]
    if unknown:
      raise ValueError(f"metadata_field: Metadata field {unknown[0]} is not supported "
                       "(signature_def is)")
    signatures = get_model_metadata_pb2.SignatureDefMap()
    signatures.signature_def[SERVING_DEFAULT].CopyFrom(signature_def(self.endpoint.model))
    answer = get_model_metadata_pb2.GetModelMetadataResponse(
        model_spec=self._spec(request.model_spec))
    answer.metadata["signature_def"].Pack(signatures)
    return answer

  async def _without(self, request, context, kind: str, method: str):
    self._resolve(request.model_spec)
    _require_signature(request.model_spec.signature_name)
    raise ValueError(f"Expected {kind} signature method_name to be {method}. Was: "
                     f"{PREDICT_METHOD}")

  @_answered
  async def Classify(self, request, context):
    await self._without(request, context, "classification", "tensorflow/serving/classify")

  @_answered
  async def Regress(self, request, context):
    await self._without(request, context, "regression", "tensorflow/serving/regress")

  @_answered
  async def MultiInference(self, request, context):
    for task in request.tasks:
      await self._without(task, context, "classification or regression",
                          "tensorflow/serving/classify or tensorflow/serving/regress")
    raise ValueError("tasks: expected at least one inference task")


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
  """TensorFlow Serving's ModelService: the model's status (its config is the command line's:
  HandleReloadConfigRequest answers UNIMPLEMENTED)."""

  def __init__(self, endpoint: Endpoint):
    self.endpoint = endpoint

  @_answered
  async def GetModelStatus(self, request, context):
    spec = request.model_spec
    self.endpoint.resolve(spec.name, spec.version.value if spec.HasField("version") else None,
                          _SPEC)
    answer = get_model_status_pb2.GetModelStatusResponse()
    answer.model_version_status.add(version=self.endpoint.version,
                                    state=get_model_status_pb2.ModelVersionStatus.AVAILABLE)
    return answer


class InferenceService(kserve_grpc.GRPCInferenceServiceServicer):
  """KServe V2's GRPCInferenceService for `endpoint`."""

  def __init__(self, endpoint: Endpoint):
    self.endpoint = endpoint

  async def ServerLive(self, request, context):
    return kserve_pb2.ServerLiveResponse(live=True)

  async def ServerReady(self, request, context):
    return kserve_pb2.ServerReadyResponse(ready=True)

  async def ModelReady(self, request, context):
    try:
      self.endpoint.resolve(request.name, request.version)
    except LookupError:
      return kserve_pb2.ModelReadyResponse(ready=False)
    return kserve_pb2.ModelReadyResponse(ready=True)

  async def ServerMetadata(self, request, context):
    return kserve_pb2.ServerMetadataResponse(**kserve.server_metadata())

  @_answered
  async def ModelMetadata(self, request, context):
    self.endpoint.resolve(request.name, request.version, ("name", "version"))
    described = kserve.metadata(self.endpoint)
    return kserve_pb2.ModelMetadataResponse(
        name=described["name"], versions=described["versions"],
        platform=described["platform"],
        inputs=[kserve_pb2.ModelMetadataResponse.TensorMetadata(**t)
                for t in described["inputs"]],
        outputs=[kserve_pb2.ModelMetadataResponse.TensorMetadata(**t)
                 for t in described["outputs"]])

  @_answered
  async def ModelInfer(self, request, context):
    self.endpoint.resolve(request.model_name, request.model_version,
                          ("model_name", "model_version"))
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
      raise ValueError(f"raw_input_contents: expected one entry per input "
                       f"({len(request.inputs)}). Received: {len(raw)}")
    named = {}
    for i, tensor in enumerate(request.inputs):
      where = f"inputs[{i}]"
      if tensor.name in named:
        raise ValueError(f"{where}.name: each input once. Received {tensor.name!r} twice")
      if raw:
        named[tensor.name] = tensors.from_raw(raw[i], tensor.datatype, list(tensor.shape), where)
      else:
        field = _CONTENTS.get(tensor.datatype)
        if field is None:
          tensors.numpy_dtype(tensor.datatype, f"{where}.datatype")  # Unknown: named.
          raise ValueError(f"{where}.contents: {tensor.datatype} travels in "
                           "raw_input_contents only")
        named[tensor.name] = tensors.shaped(list(getattr(tensor.contents, field)),
                                            tensor.datatype, list(tensor.shape), where)
    names = self.endpoint.output_names([o.name for o in request.outputs])
    outputs = await self.endpoint.predict(named, timeout=context.time_remaining(),
                                          spelled=tensors.datatype)
    answer = kserve_pb2.ModelInferResponse(model_name=self.endpoint.name,
                                           model_version=str(self.endpoint.version),
                                           id=request.id)
    for name in names:
      answer.outputs.add(**kserve.output_tensor(self.endpoint, name, outputs[name]))
      answer.raw_output_contents.append(tensors.to_raw(outputs[name]))
    return answer


def _data_type(dtype: str) -> str:
  """TensorFlow Serving's name of a TensorFlow dtype: "DT_FLOAT"."""
  return types_pb2.DataType.Name(tf.as_dtype(dtype).as_datatype_enum)


def _require_signature(name: str) -> None:
  if name not in ("", SERVING_DEFAULT):
    raise SignatureNotFound(f'model_spec.signature_name: Serving signature key "{name}" not '
                             f"found (this model has {SERVING_DEFAULT})")


def _typed_proto(array) -> tensor_pb2.TensorProto:
  """`array` as TensorFlow Serving answers it: dtype, shape and the typed field
  (`tensors.typed_field`)."""
  array = np.asarray(array)
  dtype = tf.as_dtype(array.dtype)
  proto = tensor_pb2.TensorProto(dtype=dtype.as_datatype_enum,
                                   tensor_shape=tf.TensorShape(array.shape).as_proto())
  field, values = tensors.typed_field(array, dtype.name)
  getattr(proto, field).extend(values)
  return proto
