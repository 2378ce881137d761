"""Inference: the batching predictor under concurrent callers (own answers, batches formed,
deadlines, queue bound, a bad request failing alone), `tfdist model-server` answering over
HTTP on 127.0.0.1, and `tfdist model-export` reloaded and equal."""

import concurrent.futures
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import keras
import numpy as np
import portpicker
import pytest
import tensorflow as tf

from tests.conftest import REPO
from tests.launching import ENV, read_until
from tfdist.serving.batching import BatchingPredictor, DeadlineExceeded, QueueFull
from tfdist.testing import forked

pytestmark = pytest.mark.usefixtures("two_cpus")  # Before TensorFlow starts: the split test.
rng = np.random.default_rng(0)
X = rng.random((100, 20), dtype=np.float32)


def mlp():
  keras.utils.set_random_seed(1)
  return keras.Sequential([keras.Input((20,), name="features"),
                           keras.layers.Dense(32, activation="relu"), keras.layers.Dense(3)])


def failing_on_negative_input():
  """A model whose run fails for a row with a negative first feature (a bad request)."""
  inputs = keras.Input((20,), name="features")

  def check(x):
    tf.debugging.assert_non_negative(x[:, 0], message="negative feature")
    return x
  outputs = keras.layers.Dense(3)(keras.layers.Lambda(check)(inputs))
  return keras.Model(inputs, outputs)


@pytest.fixture(scope="module")
def model():
  return mlp()


def test_concurrent_callers_each_get_their_own_answer_in_batches(model):
  reference = model.predict(X, verbose=0)
  predictor = BatchingPredictor(model, max_batch_size=16, max_wait_ms=20)
  try:
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
      answers = list(pool.map(lambda i: predictor.predict(X[i:i + 1 + i % 3]), range(64)))
    for i, answer in enumerate(answers):
      np.testing.assert_allclose(answer, reference[i:i + 1 + i % 3], atol=1e-6)
    stats = predictor.stats
    assert stats.rows == sum(1 + i % 3 for i in range(64))
    assert sum(stats.batches.values()) < 64  # Requests shared batches ...
    used = {size for size, count in stats.batches.items() if count}
    assert used <= {1, 2, 4, 8, 16} and max(used) > 1, used  # ... padded to traced sizes.
    assert stats.padding == sum(s * n for s, n in stats.batches.items()) - stats.rows
  finally:
    predictor.close()


def test_an_oversize_request_is_split_and_answered_whole(model):
  predictor = BatchingPredictor(model, max_batch_size=32)
  try:
    np.testing.assert_allclose(predictor.predict(X[:70]), model.predict(X[:70], verbose=0),
                               atol=1e-6)
    assert predictor.stats.batches[32] >= 2
  finally:
    predictor.close()


def test_a_lone_caller_never_waits_for_a_batch(model):
  """By `predict` (its own thread) and by `submit` (the batching thread, which sees no other
  caller): ten minutes each, had it waited for a batch to fill."""
  predictor = BatchingPredictor(model, max_batch_size=32, max_wait_ms=600_000)
  pool = concurrent.futures.ThreadPoolExecutor(1)
  try:
    for i in range(10):
      assert pool.submit(predictor.predict, X[i:i + 1]).result(timeout=30).shape == (1, 3)
      assert predictor.submit(X[i:i + 1]).result(timeout=30).shape == (1, 3)
    assert predictor.stats.batches[1] == 20
  finally:
    pool.shutdown(wait=False)
    predictor.close()


def test_a_lone_caller_runs_on_its_own_thread_and_concurrent_ones_are_batched(model):
  predictor = BatchingPredictor(model, max_batch_size=32, max_wait_ms=5)
  threads = []
  run = predictor.model.run
  predictor.model.run = lambda *a: (threads.append(threading.get_ident()), run(*a))[1]
  try:
    np.testing.assert_allclose(predictor.predict(X[:1]), model.predict(X[:1], verbose=0),
                               atol=1e-5)
    assert threads == [threading.get_ident()]  # No hand-off to the batching thread.
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
      answers = list(pool.map(lambda i: predictor.predict(X[i:i + 1]), range(64)))
    np.testing.assert_allclose(np.concatenate(answers), model.predict(X[:64], verbose=0),
                               atol=1e-5)
    assert predictor._thread.ident in threads  # Concurrent callers went to the batcher ...
    assert max(size for size, count in predictor.stats.batches.items() if count) > 1  # ... batched.
  finally:
    predictor.close()


def test_bad_requests_fail_alone(model):
  predictor = BatchingPredictor(failing_on_negative_input(), max_batch_size=8, max_wait_ms=50)
  try:
    with pytest.raises(ValueError, match=r"input features: expected shape \[\?, 20\] \(rows "
                                         r"first\). Received: \[1, 19\]"):
      predictor.submit(X[:1, :19])
    with pytest.raises(ValueError, match="input features: expected float32 values. Received: "):
      predictor.submit(np.array([["a"] * 20]))
    bad = X[:1].copy()
    bad[0, 0] = -1
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
      futures = [pool.submit(predictor.predict, row) for row in (X[:1], bad, X[1:2], X[2:3])]
      results = [f.exception() or f.result() for f in futures]
    assert isinstance(results[1], tf.errors.InvalidArgumentError)
    assert all(isinstance(r, np.ndarray) and r.shape == (1, 3) for i, r in enumerate(results)
               if i != 1)
  finally:
    predictor.close()


def held_model(started, release):
  """A model whose every call sets the event `started` as it begins and ends once `release` is
  set (within 30 s)."""
  inputs = keras.Input((20,), name="features")

  def sleep(x):
    started.set()
    assert release.wait(30), "never released"
    return x
  slowed = keras.layers.Lambda(lambda x: tf.ensure_shape(
      tf.numpy_function(sleep, [x], tf.float32), x.shape))(inputs)
  return keras.Model(inputs, keras.layers.Dense(3)(slowed))


def test_deadlines_and_the_queue_bound_are_honoured():
  started, release = threading.Event(), threading.Event()
  release.set()  # For the warm-up's call.
  predictor = BatchingPredictor(held_model(started, release), max_batch_size=1, max_queue=2)
  started.clear()
  release.clear()
  try:
    busy = predictor.submit(X[:1])  # Runs until released; the next two wait in the queue.
    assert started.wait(30)
    expiring = predictor.submit(X[1:2], timeout=0.01)
    waiting = predictor.submit(X[2:3])
    with pytest.raises(QueueFull, match=r"queue full \(2 requests waiting\)"):
      predictor.submit(X[3:4])
    time.sleep(0.05)  # Past the expiring request's deadline, while it still waits.
    release.set()
    with pytest.raises(DeadlineExceeded):
      expiring.result(timeout=5)
    assert busy.result(timeout=5).shape == waiting.result(timeout=5).shape == (1, 3)
    assert predictor.stats.expired == 1 and predictor.stats.rejected == 1
    assert predictor.stats.rows == 2  # The expired request never ran.
  finally:
    predictor.close()


def test_a_model_split_over_devices_is_served_through_the_predictor(model):
  from tfdist.parallel.split_model import split
  reference = model.predict(X, verbose=0)
  split_model = split(mlp(), "balanced", devices=["/device:CPU:0", "/device:CPU:1"],
                      microbatches=2)
  predictor = BatchingPredictor(split_model, max_batch_size=8)
  try:
    np.testing.assert_allclose(predictor.predict(X[:20]), reference[:20], atol=1e-6)
  finally:
    predictor.close()


# -- the HTTP endpoint -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def saved(tmp_path_factory, model):
  path = tmp_path_factory.mktemp("served") / "model.keras"
  model.save(path)
  return path


def start_server(model_path, *flags, name="digits"):
  server = subprocess.Popen([sys.executable, "-m", "tfdist", "model-server", str(model_path),
                             "--model-name", name, *flags], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
  match = read_until(server, rf"(http://127\.0\.0\.1:\d+)/v1/models/{name} .* "
                             r"grpc://(127\.0\.0\.1:\d+)", 90, [])  # Or killed, and failed.
  os.set_blocking(server.stdout.fileno(), True)
  server.grpc_address = match.group(2)  # Beside the HTTP URL, for the gRPC tests.
  return server, match.group(1)


def stop(server):
  server.send_signal(signal.SIGINT)
  try:
    assert server.wait(timeout=20) == 0
  finally:
    if server.poll() is None:
      server.kill()


def call(url, body=None, content_type="application/json", headers=None):
  data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
  request = urllib.request.Request(url, data=data, headers={"Content-Type": content_type,
                                                            **(headers or {})})
  try:
    with urllib.request.urlopen(request, timeout=30) as response:
      return response.status, response.headers, response.read()
  except urllib.error.HTTPError as e:
    return e.code, e.headers, e.read()


@pytest.fixture(scope="module")
def served(saved):
  """(the HTTP URL, the gRPC address) of a server of the digits model."""
  process, url = start_server(saved, "--max-body-bytes", "200000", "--max-queue", "1",
                              "--max-batch-size", "8")
  yield url, process.grpc_address
  stop(process)


@pytest.fixture(scope="module")
def server(served):
  return served[0]


@pytest.mark.parametrize("name,port", [("a TensorFlow Serving gRPC client", "8500"),
                                       ("a KServe V2 client", "8501")])
def test_the_serving_pages_clients_run_as_written(served, name, port, model):
  """The how-to's client examples, against a server of the digits model (its ports put in,
  NumPy's random rows seeded): the scores they print are the model's own."""
  from tests import docs_blocks
  address = served[1] if port == "8500" else served[0].removeprefix("http://")
  code = docs_blocks.named(name).code.replace(f"127.0.0.1:{port}", address)
  done = subprocess.run([sys.executable, "-c", "import numpy\nnumpy.random.seed(7)\n" + code],
                        env=ENV, cwd=REPO, capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr[-3000:]
  np.random.seed(7)
  reference = model.predict(np.random.rand(2, 20).astype("float32"), verbose=0)
  printed = [float(n) for n in re.findall(r"-?\d+\.\d*(?:e[-+]?\d+)?", done.stdout)]
  np.testing.assert_allclose(printed, reference.ravel(), atol=1e-5, err_msg=done.stdout)


def test_the_endpoint_predicts_in_tensorflow_servings_formats(server, model):
  reference = model.predict(X[:4], verbose=0)
  status, _, body = call(f"{server}/v1/models/digits:predict", {"instances": X[:4].tolist()})
  assert status == 200
  np.testing.assert_allclose(json.loads(body)["predictions"], reference, atol=1e-5)
  status, _, body = call(f"{server}/v1/models/digits:predict", {"inputs": X[:4].tolist()})
  np.testing.assert_allclose(json.loads(body)["outputs"], reference, atol=1e-5)
  # JSON's numbers carry no dtype: integers for a float input are converted, as TensorFlow
  # Serving's REST API converts them (a typed TensorProto or KServe datatype must match).
  whole = np.round(X[:4] * 10)
  status, _, body = call(f"{server}/v1/models/digits:predict",
                         {"instances": whole.astype(int).tolist()})
  assert status == 200, body
  np.testing.assert_allclose(json.loads(body)["predictions"], model.predict(whole, verbose=0),
                             atol=1e-4)
  buffer = io.BytesIO()
  np.save(buffer, X[:4])
  status, headers, body = call(f"{server}/v1/models/digits:predict", buffer.getvalue(),
                               content_type="application/x-npy")
  assert status == 200 and headers["Content-Type"] == "application/x-npy"
  np.testing.assert_allclose(np.load(io.BytesIO(body)), reference, atol=1e-5)


def test_the_endpoint_reports_status_metadata_health_and_metrics(server):
  status, _, body = call(f"{server}/v1/models/digits")
  assert status == 200 and json.loads(body)["model_version_status"][0]["state"] == "AVAILABLE"
  status, _, body = call(f"{server}/v1/models/digits/metadata")
  document = json.loads(body)  # TensorFlow Serving's: a SignatureDefMap in protobuf's JSON.
  assert document["model_spec"] == {"name": "digits", "signature_name": "", "version": "1"}
  signature = document["metadata"]["signature_def"]["signature_def"]["serving_default"]
  assert signature["method_name"] == "tensorflow/serving/predict"
  assert signature["inputs"]["features"]["dtype"] == "DT_FLOAT"
  assert signature["inputs"]["features"]["tensor_shape"] == {
      "dim": [{"size": "-1", "name": ""}, {"size": "20", "name": ""}], "unknown_rank": False}
  assert call(f"{server}/healthz")[0] == 200
  status, _, body = call(f"{server}/metrics")
  assert status == 200
  assert re.search(rb'tfdist_batches_total\{batch_size="\d+",model="digits"\} \d', body) or \
      re.search(rb'tfdist_batches_total\{model="digits",batch_size="\d+"\} \d', body)
  assert b"tfdist_queue_depth" in body and b"tfdist_padding_rows_total" in body


@pytest.mark.parametrize("body,content_type,code,message", [
    ({"instances": [[0.5] * 19]}, "application/json", 400,
     "input features: expected shape [?, 20] (rows first). Received: [1, 19]"),
    ({"instances": [["x"] * 20]}, "application/json", 400,
     "input features: expected float32 values. Received: "),
    (b"{not json", "application/json", 400, "the body is not JSON"),
    ({"rows": []}, "application/json", 400,
     'the body must be an object with "instances" (rows) or "inputs" (columns). '
     "Received: ['rows']"),
    ({}, "application/json", 400, 'the body must be an object with "instances" (rows) or '
     '"inputs" (columns). Received: an empty object {}'),
    ({"instances": [[0.5] * 20] * 2000}, "application/json", 413,
     "the body is over the limit of 200000 bytes"),
])
def test_bad_requests_get_a_4xx_naming_the_problem(server, body, content_type, code, message):
  status, _, answer = call(f"{server}/v1/models/digits:predict", body, content_type)
  assert status == code
  assert json.loads(answer)["error"].startswith(message)


def test_another_models_name_is_404(server):
  status, _, body = call(f"{server}/v1/models/other:predict", {"instances": [[0.0] * 20]})
  assert status == 404 and "this server serves 'digits'" in json.loads(body)["error"]


def test_a_full_queue_answers_429_with_retry_after(server):
  results = []

  def one():
    results.append(call(f"{server}/v1/models/digits:predict", {"instances": [[0.5] * 20]}))
  threads = [threading.Thread(target=one) for _ in range(48)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  codes = [status for status, _, _ in results]
  assert set(codes) <= {200, 429} and 429 in codes and 200 in codes
  refused = next(r for r in results if r[0] == 429)
  assert refused[1]["Retry-After"] == "1"
  assert json.loads(refused[2])["error"].startswith("queue full (1 requests waiting)")


def test_an_exported_saved_model_reloads_equal_and_is_served(tmp_path, saved, model):
  done = forked.run([sys.executable, "-m", "tfdist", "model-export", str(saved),
                     str(tmp_path / "out"), "--max-batch-size", "16", "--max-wait-ms", "7"],
                    cwd=REPO, env=ENV, timeout=120)
  assert done.returncode == 0, done.stderr[-2000:]
  batching = (tmp_path / "out" / "batching_parameters.txt").read_text()
  assert "allowed_batch_sizes: 16" in batching and \
      "batch_timeout_micros { value: 7000 }" in batching, batching
  loaded = tf.saved_model.load(str(tmp_path / "out" / "1")).signatures["serving_default"]
  assert list(loaded.structured_input_signature[1]) == ["features"]
  outputs = loaded(features=tf.constant(X[:5]))
  np.testing.assert_allclose(next(iter(outputs.values())), model.predict(X[:5], verbose=0),
                             atol=1e-5)
  # The ports asked for, on the host asked for; a ten-minute batching wait that a lone request
  # (answered within `call`'s 30 s) does not wait for.
  http_port, grpc_port = portpicker.pick_unused_port(), portpicker.pick_unused_port()
  process, url = start_server(tmp_path / "out" / "1", "--host", "127.0.0.1", "--port",
                              str(http_port), "--grpc-port", str(grpc_port), "--max-wait-ms",
                              "600000")
  try:
    assert (url, process.grpc_address) == (f"http://127.0.0.1:{http_port}",
                                            f"127.0.0.1:{grpc_port}")
    status, _, body = call(f"{url}/v1/models/digits:predict", {"instances": X[:2].tolist()})
    assert status == 200
    predictions = json.loads(body)["predictions"]
    np.testing.assert_allclose([list(p.values())[0] if isinstance(p, dict) else p
                                for p in predictions], model.predict(X[:2], verbose=0),
                               atol=1e-5)
  finally:
    stop(process)


# -- bulk prediction -----------------------------------------------------------------------------

def mirrored_model():
  import tfdist
  config = {"strategy": "mirrored", "devices": {"logical_cpus": 2},
            "training": {"global_batch_size": 16, "mixed_precision": "off"}}
  return tfdist.fit(mlp, X, rng.integers(0, 3, len(X)), config=config, verbose=0,
                    compile=dict(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(
                        from_logits=True))).model


def test_bulk_predict_under_mirrored_keeps_input_order_and_equals_one_device(tmp_path):
  import tfdist
  model = mirrored_model()
  reference = mlp()
  reference.set_weights(model.get_weights())
  x = rng.random((103, 20), dtype=np.float32)  # 6 full batches of 16 and a padded one of 7.
  expected = reference.predict(x, verbose=0)
  np.testing.assert_allclose(tfdist.predict(model, x, batch_size=16), expected, atol=1e-6)
  written = tfdist.predict(model, x, batch_size=16, out=str(tmp_path / "predictions.npy"))
  np.testing.assert_allclose(np.load(tmp_path / "predictions.npy"), expected, atol=1e-6)
  assert isinstance(written, np.memmap)
  batches = list(tfdist.predict(model, tf.data.Dataset.from_tensor_slices(x).batch(16),
                                stream=True))
  assert [len(b) for b in batches] == [16] * 6 + [7]
  np.testing.assert_allclose(np.concatenate(batches), expected, atol=1e-6)
  with pytest.raises(Exception, match="stream: needs numpy arrays or a tf.data.Dataset, and no "
                                      "Keras predict arguments \\(callbacks\\)"):
    tfdist.predict(model, x, batch_size=16, stream=True, callbacks=[])


def test_bulk_predict_on_a_two_worker_cluster_equals_one_device(tmp_path):
  from tests.conftest import PROGRAMS
  from tests.launching import finish, start_launch
  config = tmp_path / "config.yaml"
  config.write_text("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n"
                    "training: {global_batch_size: 64, epochs: 1, mixed_precision: off}\n")
  launcher = start_launch(str(config), "--logs", str(tmp_path / "logs"), "--", sys.executable,
                          str(PROGRAMS / "predict_cluster.py"), str(tmp_path))
  output = finish(launcher, 240, [])
  assert launcher.returncode == 0, output[-3000:]
  for task in ("worker-0", "worker-1"):  # Every worker has every prediction, in order.
    result = json.loads((tmp_path / f"{task}.json").read_text())
    assert result["shape"] == [1003, 5] and result["difference"] < 1e-5, result


def test_the_model_server_refuses_a_missing_model_in_one_line(tmp_path):
  done = forked.run([sys.executable, "-m", "tfdist", "model-server", str(tmp_path / "x.keras"),
                     "--model-name", "m"], cwd=REPO, env=ENV, timeout=120)
  assert done.returncode == 2
  assert done.stderr.strip().splitlines()[-1] == (
      f"tfdist model-server: MODEL: must be a .keras file, a SavedModel directory, or a "
      f"directory of numbered SavedModel versions (TensorFlow Serving's layout). "
      f"Received: '{tmp_path / 'x.keras'}'")


# -- a text model, end to end --------------------------------------------------------------------


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
  """A user's text classifier trained under mirrored (2 logical CPUs) through the launcher and
  exported for TensorFlow Serving: (the .keras file, the export directory)."""
  from tests.conftest import PROGRAMS
  from tests.launching import finish, start_launch
  out = tmp_path_factory.mktemp("text")
  (out / "config.yaml").write_text("strategy: mirrored\ndevices: {logical_cpus: 2}\n"
                                   "training: {global_batch_size: 32, epochs: 2}\n")
  launch = start_launch(str(out / "config.yaml"), "--logs", str(out / "logs"), "--",
                        sys.executable, str(PROGRAMS / "text_classifier.py"), str(out))
  output = finish(launch, 240, [])
  assert launch.returncode == 0, output[-3000:]
  done = forked.run([sys.executable, "-m", "tfdist", "model-export",
                     str(out / "text.keras"), str(out / "export")], cwd=REPO, env=ENV,
                    timeout=120)
  assert done.returncode == 0, done.stdout + done.stderr[-2000:]
  assert "reloaded, equal" in done.stdout and done.stderr == "", done.stderr[-2000:]
  return out / "text.keras", out / "export"


def test_a_text_model_is_exported_and_served_from_tensorflow_servings_layout(text_model):
  keras_file, export = text_model
  sentences = ["good great movie", "awful bad plot the", ""]
  reference = keras.models.load_model(keras_file).predict(tf.constant(sentences), verbose=0)
  process, url = start_server(export, name="text")  # Version folders: the newest, 1.
  try:
    for path in ("text:predict", "text/versions/1:predict"):
      status, _, body = call(f"{url}/v1/models/{path}", {"instances": sentences})
      assert status == 200, body
      np.testing.assert_allclose(json.loads(body)["predictions"], reference, atol=1e-5)
    status, _, body = call(f"{url}/v1/models/text:predict",
                           {"instances": [{"text": s} for s in sentences]})  # Named rows.
    np.testing.assert_allclose(json.loads(body)["predictions"], reference, atol=1e-5)
    status, _, body = call(f"{url}/v1/models/text:predict", {"inputs": {"text": sentences}})
    np.testing.assert_allclose(json.loads(body)["outputs"], reference, atol=1e-5)
    assert call(f"{url}/v1/models/text/versions/1")[0] == 200
    status, _, body = call(f"{url}/v1/models/text/versions/2:predict", {"instances": ["a"]})
    assert status == 404 and json.loads(body)["error"] == (
        "model 'text' has no version '2'; this server serves version 1")
    status, _, body = call(f"{url}/v1/models/text:predict", {"instances": [3]})
    assert status == 400 and json.loads(body)["error"] == (
        "input text: expected string values. Received: int64 values")
    metrics = call(f"{url}/metrics")[2].decode()
    assert 'tfdist_requests_total{code="200",model="text"} 5.0' in metrics, metrics
    assert 'tfdist_requests_total{code="404",model="text"} 1.0' in metrics
    assert 'tfdist_requests_total{code="400",model="text"} 1.0' in metrics
    import tritonclient.http as triton_http  # KServe V2's BYTES, from Triton's own client.
    client = triton_http.InferenceServerClient(url.removeprefix("http://"))
    strings = triton_http.InferInput("text", [len(sentences)], "BYTES")
    strings.set_data_from_numpy(np.array([s.encode() for s in sentences], dtype=object))
    np.testing.assert_allclose(client.infer("text", [strings]).as_numpy(
        client.get_model_metadata("text")["outputs"][0]["name"]), reference, atol=1e-5)
    client.close()
  finally:
    stop(process)


def test_a_token_id_model_refuses_an_id_past_its_vocabulary_in_json(tmp_path):
  keras.utils.set_random_seed(1)
  tokens = keras.Input((4,), dtype="int64", name="tokens")
  pooled = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(10, 4)(tokens))
  model = keras.Model(tokens, keras.layers.Dense(2)(pooled))
  model.save(tmp_path / "ids.keras")
  process, url = start_server(tmp_path / "ids.keras", name="ids")
  try:
    status, _, body = call(f"{url}/v1/models/ids:predict", {"instances": [{"tokens": [1, 2, 3, 4]}]})
    assert status == 200
    np.testing.assert_allclose(json.loads(body)["predictions"],
                               model.predict(np.array([[1, 2, 3, 4]]), verbose=0), atol=1e-5)
    status, headers, body = call(f"{url}/v1/models/ids:predict", {"instances": [[1, 2, 3, 99]]})
    assert status == 400 and headers["Content-Type"].startswith("application/json")
    assert json.loads(body)["error"] == (
        "the model refused the request: indices[0,3] = 99 is not in [0, 10)"), body
    status, _, body = call(f"{url}/v1/models/ids:predict", {"instances": [{"token": [1]}]})
    assert status == 400 and json.loads(body)["error"] == (
        "\"instances\": each row must be an object with the keys ['tokens']. "
        "Received: ['token']")
  finally:
    stop(process)
