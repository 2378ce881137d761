"""`tfdist model-server` spoken to by clients no one here wrote: TensorFlow Serving's own gRPC
stubs (`tensorflow-serving-api`) and Triton's `tritonclient` over KServe V2's HTTP and gRPC;
outputs against `model.predict`, errors as each protocol's status codes, and bodies the
decoders cannot take or the queue could not hold."""

import json

import grpc
import keras
import numpy as np
import pytest
import tensorflow as tf
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tensorflow_serving.apis import (classification_pb2, get_model_metadata_pb2,
                                     get_model_status_pb2, model_service_pb2_grpc, predict_pb2,
                                     prediction_service_pb2_grpc, regression_pb2)
from tritonclient.utils import InferenceServerException

from tests.test_serving import start_server, stop

pytestmark = pytest.mark.usefixtures("two_cpus")  # TensorFlow starts with the suite's devices.
MAX_BODY = 20_000_000
rng = np.random.default_rng(0)
FEATURES = rng.random((64, 20), dtype=np.float32).round(3)
IDS = rng.integers(0, 50, (64, 4))


def two_headed():
  """A functional model of two inputs (float features, int64 token ids) and two outputs."""
  keras.utils.set_random_seed(2)
  features = keras.Input((20,), name="features")
  ids = keras.Input((4,), dtype="int64", name="ids")
  pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(50, 8)(ids))
  hidden = keras.layers.Dense(16, activation="relu")(
      keras.layers.Concatenate()([features, pooled]))
  return keras.Model([features, ids], {"scores": keras.layers.Dense(3, name="scores")(hidden),
                                       "gate": keras.layers.Dense(1, activation="sigmoid",
                                                                  name="gate")(hidden)})


@pytest.fixture(scope="module")
def model():
  return two_headed()


@pytest.fixture(scope="module")
def reference(model):
  return model.predict({"features": FEATURES, "ids": IDS}, verbose=0)


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
  """(the HTTP address host:port, the gRPC address host:port)."""
  path = tmp_path_factory.mktemp("protocols") / "model.keras"
  model.save(path)
  process, url = start_server(path, "--max-body-bytes", str(MAX_BODY), "--max-queue", "2",
                              "--max-batch-size", "16", name="two")
  yield url.removeprefix("http://"), process.grpc_address
  stop(process)


@pytest.fixture(scope="module")
def stubs(server):
  channel = grpc.insecure_channel(server[1], options=[("grpc.max_send_message_length", -1)])
  yield (prediction_service_pb2_grpc.PredictionServiceStub(channel),
         model_service_pb2_grpc.ModelServiceStub(channel))
  channel.close()


def _predict_request(features=FEATURES, ids=IDS, name="two", **spec):
  request = predict_pb2.PredictRequest()
  request.model_spec.name = name
  for key, value in spec.items():
    if key == "version":
      request.model_spec.version.value = value
    else:
      setattr(request.model_spec, key, value)
  request.inputs["features"].CopyFrom(tf.make_tensor_proto(features))
  request.inputs["ids"].CopyFrom(tf.make_tensor_proto(ids))
  return request


def test_tensorflow_servings_stub_predicts_as_keras_and_describes_the_model(stubs, reference):
  predictions, models = stubs
  answer = predictions.Predict(_predict_request(), timeout=30)
  assert answer.model_spec.name == "two" and answer.model_spec.version.value == 1
  assert sorted(answer.outputs) == ["gate", "scores"]
  for name in ("gate", "scores"):
    np.testing.assert_allclose(tf.make_ndarray(answer.outputs[name]), reference[name],
                               atol=1e-5)
  # As TensorFlow Serving answers by default (its predict_util's AsProtoField), and its own
  # example client reads it: the typed fields, no packed tensor_content.
  for name in ("gate", "scores"):
    proto = answer.outputs[name]
    assert proto.tensor_content == b"" and proto.dtype == tf.float32.as_datatype_enum
    np.testing.assert_allclose(np.reshape(proto.float_val, reference[name].shape),
                               reference[name], atol=1e-5)
  request = _predict_request(version=1, signature_name="serving_default")
  request.output_filter.append("scores")
  assert list(predictions.Predict(request, timeout=30).outputs) == ["scores"]

  asked = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
  asked.model_spec.name = "two"
  signatures = get_model_metadata_pb2.SignatureDefMap()
  predictions.GetModelMetadata(asked, timeout=30).metadata["signature_def"].Unpack(signatures)
  signature = signatures.signature_def["serving_default"]
  assert signature.method_name == "tensorflow/serving/predict"
  assert signature.inputs["features"].dtype == tf.float32.as_datatype_enum
  assert signature.inputs["ids"].dtype == tf.int64.as_datatype_enum
  assert [d.size for d in signature.inputs["ids"].tensor_shape.dim] == [-1, 4]
  assert [d.size for d in signature.outputs["scores"].tensor_shape.dim] == [-1, 3]

  status = get_model_status_pb2.GetModelStatusRequest()
  status.model_spec.name = "two"
  (version,) = models.GetModelStatus(status, timeout=30).model_version_status
  assert version.version == 1
  assert version.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE


def _without(name, field, value):
  request = _predict_request()
  if field == "inputs":
    del request.inputs[name]
  else:
    request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
  return request


@pytest.mark.parametrize("request_of,code,message", [
    # A TensorProto's dtype is the input's, as TensorFlow Serving requires ("Expects arg[0]
    # to be float but int64 is provided"); before, an int64 tensor was served as floats.
    (lambda: _without("features", "value", np.full((2, 20), "x")), "INVALID_ARGUMENT",
     "inputs['features']: expected DT_FLOAT. Received: DT_STRING"),
    (lambda: _without("features", "value", FEATURES.astype(np.int64)), "INVALID_ARGUMENT",
     "inputs['features']: expected DT_FLOAT. Received: DT_INT64"),
    (lambda: _without("ids", "value", FEATURES[:, :4]), "INVALID_ARGUMENT",
     "inputs['ids']: expected DT_INT64. Received: DT_FLOAT"),
    (lambda: _without("ids", "value", IDS.astype(np.int32)), "INVALID_ARGUMENT",
     "inputs['ids']: expected DT_INT64. Received: DT_INT32"),
    (lambda: _without("features", "value", FEATURES[:, :19]), "INVALID_ARGUMENT",
     "input features: expected shape [?, 20] (rows first). Received: [64, 19]"),
    (lambda: _without("ids", "inputs", None), "INVALID_ARGUMENT",
     "inputs: expected the names ['features', 'ids']. Received: ['features']"),
    (lambda: _predict_request(name="other"), "NOT_FOUND",
     "model_spec.name: no model named 'other'; this server serves 'two'"),
    (lambda: _predict_request(version=2), "NOT_FOUND",
     "model_spec.version: model 'two' has no version '2'; this server serves version 1"),
    (lambda: _predict_request(version_label="stable"), "INVALID_ARGUMENT",
     "model_spec.version_label: this server has no labels"),
    (lambda: _predict_request(signature_name="classify"), "FAILED_PRECONDITION",
     'model_spec.signature_name: Serving signature key "classify" not found'),
])
def test_a_bad_grpc_predict_gets_its_status_code_and_names_the_field(stubs, request_of, code,
                                                                      message):
  with pytest.raises(grpc.RpcError) as refused:
    stubs[0].Predict(request_of(), timeout=30)
  assert refused.value.code() == getattr(grpc.StatusCode, code)
  assert refused.value.details().startswith(message), refused.value.details()


def test_classify_and_regress_get_tensorflow_servings_answer_for_a_predict_only_model(stubs):
  for method, request, kind in (
      (stubs[0].Classify, classification_pb2.ClassificationRequest(), "classification"),
      (stubs[0].Regress, regression_pb2.RegressionRequest(), "regression")):
    request.model_spec.name = "two"
    with pytest.raises(grpc.RpcError) as refused:
      method(request, timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith(f"Expected {kind} signature method_name to be "
                                              "tensorflow/serving/")


def test_a_grpc_message_over_the_limit_is_resource_exhausted_and_the_server_lives(stubs):
  rows = MAX_BODY // (20 * 4) + 1000
  with pytest.raises(grpc.RpcError) as refused:
    stubs[0].Predict(_predict_request(np.zeros((rows, 20), np.float32),
                                      np.zeros((rows, 4), np.int64)), timeout=60)
  assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
  assert stubs[0].Predict(_predict_request(), timeout=30).outputs


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_tritons_client_speaks_kserve_v2_to_the_server(server, reference, protocol):
  module = triton_http if protocol == "http" else triton_grpc
  client = module.InferenceServerClient(server[0] if protocol == "http" else server[1])
  try:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("two") and client.is_model_ready("two", "1")
    assert not client.is_model_ready("other")
    metadata = client.get_model_metadata("two")
    if protocol == "grpc":
      from google.protobuf import json_format
      metadata = json_format.MessageToDict(metadata)
      for tensor in metadata["inputs"] + metadata["outputs"]:
        tensor["shape"] = [int(s) for s in tensor["shape"]]
    assert {t["name"]: (t["datatype"], t["shape"]) for t in metadata["inputs"]} == {
        "features": ("FP32", [-1, 20]), "ids": ("INT64", [-1, 4])}
    assert {t["name"]: (t["datatype"], t["shape"]) for t in metadata["outputs"]} == {
        "scores": ("FP32", [-1, 3]), "gate": ("FP32", [-1, 1])}
    binaries = (True, False) if protocol == "http" else (None,)
    for binary in binaries:  # The binary tensor data extension, then JSON.
      inputs = [module.InferInput("features", list(FEATURES.shape), "FP32"),
                module.InferInput("ids", list(IDS.shape), "INT64")]
      for tensor, values in zip(inputs, (FEATURES, IDS)):
        if binary is None:
          tensor.set_data_from_numpy(values)
        else:
          tensor.set_data_from_numpy(values, binary_data=binary)
      outputs = [module.InferRequestedOutput("scores", **(
          {} if binary is None else {"binary_data": binary}))]
      result = client.infer("two", inputs, outputs=outputs, request_id="r1")
      np.testing.assert_allclose(result.as_numpy("scores"), reference["scores"], atol=1e-5)
      assert result.as_numpy("gate") is None  # Not asked for.
      result = client.infer("two", inputs, model_version="1")
      np.testing.assert_allclose(result.as_numpy("gate"), reference["gate"], atol=1e-5)
    # Each datatype the input's, as Triton checks; before, INT32 ids were served.
    for datatype, dtype in (("FP32", np.float32), ("INT32", np.int32)):
      wrong = module.InferInput("ids", list(IDS.shape), datatype)
      wrong.set_data_from_numpy(IDS.astype(dtype))
      with pytest.raises(InferenceServerException,
                         match=rf"inputs\['ids'\]: expected INT64. Received: {datatype}"):
        client.infer("two", [inputs[0], wrong])
    with pytest.raises(InferenceServerException, match=r"no model named 'other'"):
      client.infer("other", inputs)
    with pytest.raises(InferenceServerException, match=r"has no version '3'"):
      client.infer("two", inputs, model_version="3")
  finally:
    client.close()


def _post(address, path, body, headers=None):
  import urllib.error
  import urllib.request
  request = urllib.request.Request(f"http://{address}{path}", data=body, headers={
      "Content-Type": "application/json", **(headers or {})})
  try:
    with urllib.request.urlopen(request, timeout=120) as response:
      return response.status, response.read()
  except urllib.error.HTTPError as e:
    return e.code, e.read()


def test_40000_rows_in_one_request_are_answered_whole_on_every_protocol(server, stubs, model):
  """The queue holds 2 requests and a batch 16 rows: 40,000 rows are 2,500 batches of one
  request, answered whole (not 429), over REST, KServe V2 HTTP and TensorFlow Serving's gRPC."""
  features = np.tile(FEATURES, (625, 1))
  ids = np.tile(IDS, (625, 1))
  want = model.predict({"features": features, "ids": ids}, batch_size=4096, verbose=0)
  status, body = _post(server[0], "/v1/models/two:predict", json.dumps(
      {"inputs": {"features": features.tolist(), "ids": ids.tolist()}}).encode())
  assert status == 200, body[:300]
  np.testing.assert_allclose(json.loads(body)["outputs"]["scores"], want["scores"], atol=1e-5)
  status, body = _post(server[0], "/v2/models/two/infer", json.dumps({"inputs": [
      {"name": "features", "datatype": "FP32", "shape": list(features.shape),
       "data": features.ravel().tolist()},
      {"name": "ids", "datatype": "INT64", "shape": list(ids.shape),
       "data": ids.ravel().tolist()}]}).encode())
  assert status == 200, body[:300]
  gate = next(o for o in json.loads(body)["outputs"] if o["name"] == "gate")
  assert gate["shape"] == [40000, 1]
  np.testing.assert_allclose(np.reshape(gate["data"], (40000, 1)), want["gate"], atol=1e-5)
  answer = stubs[0].Predict(_predict_request(features, ids), timeout=120)
  np.testing.assert_allclose(tf.make_ndarray(answer.outputs["scores"]), want["scores"],
                             atol=1e-5)


@pytest.mark.parametrize("path", ["/v1/models/two:predict", "/v2/models/two/infer"])
@pytest.mark.parametrize("body,message", [
    (b"[" * 100_000 + b"]" * 100_000, "the body is nested too deeply for the JSON decoder"),
    (b'{"instances": "\xff\xfe"}', "the body is not JSON"),
    (b"{not json", "the body is not JSON"),
])
def test_a_body_the_decoder_cannot_take_is_a_400_and_the_server_lives(server, path, body,
                                                                      message):
  status, answer = _post(server[0], path, body)
  assert status == 400 and json.loads(answer)["error"].startswith(message), answer[:300]
  status, _ = _post(server[0], "/v1/models/two:predict", json.dumps(
      {"inputs": {"features": FEATURES[:2].tolist(), "ids": IDS[:2].tolist()}}).encode())
  assert status == 200


@pytest.mark.parametrize("document,message", [
    ({"inputs": []}, 'the body must be an object with "inputs": a non-empty list'),
    ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 20],
                  "data": [0.5] * 19}]}, "inputs[0].data: expected 20 values (shape [1, 20]). "
     "Received: 19"),
    ({"inputs": [{"name": "features", "datatype": "FLOAT", "shape": [1, 20],
                  "data": [0.5] * 20}]}, "inputs[0].datatype: expected a KServe V2 datatype"),
    ({"inputs": [{"name": "features", "datatype": "FP32", "shape": "1x20",
                  "data": [0.5] * 20}]}, "inputs[0].shape: expected a list of sizes"),
    ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 20],
                  "data": [0.5] * 20}]},
     "inputs: expected the names ['features', 'ids']. Received: ['features']"),
    ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 20],
                  "data": [0.5] * 20},
                 {"name": "ids", "datatype": "INT32", "shape": [1, 4], "data": [1] * 4}]},
     "inputs['ids']: expected INT64. Received: INT32"),  # Triton's check of a datatype.
    ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 20],
                  "parameters": {"binary_data_size": 80}}]},
     "inputs[0].parameters.binary_data_size: 80 bytes, but only 0 remain in the body"),
])
def test_a_bad_kserve_request_is_a_400_naming_the_field(server, document, message):
  status, answer = _post(server[0], "/v2/models/two/infer", json.dumps(document).encode())
  assert status == 400 and json.loads(answer)["error"].startswith(message), answer


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "int16", "int32", "uint8",
                                   "uint16", "int64", "uint32", "uint64", "bool", "float16",
                                   "bfloat16", "complex64", "complex128", "string"])
def test_every_dtype_is_answered_in_its_typed_field_as_tensorflow_reads_it(dtype):
  """tf.make_ndarray, TensorFlow's own reader, gives the array back from the typed field
  alone."""
  from tfdist.serving.grpc_services import _typed_proto
  values = np.arange(6).reshape(2, 3) * 3 + 1
  array = (np.array([b"a", b"bc", b"", b"d", b"e", b"f"], dtype=object).reshape(2, 3)
           if dtype == "string" else tf.constant(values, dtype=dtype).numpy())
  proto = _typed_proto(array)
  assert proto.tensor_content == b"" and proto.dtype == tf.as_dtype(dtype).as_datatype_enum
  back = tf.make_ndarray(proto)
  assert back.shape == (2, 3)
  np.testing.assert_array_equal(back, array)
