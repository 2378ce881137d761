"""`tfdist model-server MODEL --model-name NAME [--port P] [--grpc-port P] [--host H]`: serves
a `.keras` file, a SavedModel directory or TensorFlow Serving's directory of numbered versions
(the newest) until Ctrl-C: over HTTP, TensorFlow Serving's REST surface
(`POST /v1/models/NAME:predict`) and KServe V2's (`/v2/models/NAME/infer`); over gRPC,
TensorFlow Serving's PredictionService and ModelService and KServe V2's GRPCInferenceService;
one batching queue behind them all. Needs the `serving` extra (aiohttp, prometheus-client) and
the protocols' own protos: `pip install --no-deps tensorflow-serving-api tritonclient`."""

from __future__ import annotations

import asyncio
import signal

from absl import app, flags

from tfdist.cli import flags as cli_flags
from tfdist.config.schema import TaskConfig
from tfdist.errors import ConfigError, MissingExtraError

FLAGS_DECLARED = (
    cli_flags.Flag("model-name", "string", None, "The model's name in its URLs "
                   "(/v1/models/NAME), as TensorFlow Serving's --model_name.", metavar="NAME",
                   required=True),
    cli_flags.PORT,
    cli_flags.Flag("grpc-port", "integer", None, "The port it serves gRPC on (TensorFlow "
                   "Serving's PredictionService, KServe V2's GRPCInferenceService; default: a "
                   "free one; TensorFlow Serving's is 8500).", metavar="PORT", lower=1,
                   upper=65535),
    cli_flags.Flag("host", "string", "127.0.0.1", "The address HTTP and gRPC listen on.",
                   metavar="HOST"),
    cli_flags.MAX_BATCH_SIZE,
    cli_flags.MAX_WAIT_MS,
    cli_flags.Flag("max-queue", "integer", 1024, "Requests waiting at most; beyond it 429 (gRPC: "
                   "RESOURCE_EXHAUSTED). A request larger than a batch takes one place and is "
                   "answered whole.", metavar="N", lower=1),
    cli_flags.Flag("max-body-bytes", "integer", 64 << 20, "The largest request body or gRPC "
                   "message; beyond it 413 (gRPC: RESOURCE_EXHAUSTED).", metavar="N", lower=1),
)
OLD_SPELLINGS = {"name": "model-name"}
USAGE = cli_flags.usage("model-server", "MODEL", FLAGS_DECLARED)
FLAGS = flags.FLAGS


def run(args: list[str], task: TaskConfig | None) -> int:
  del task
  if len(args) != 1:
    raise app.UsageError(f"usage: {USAGE}")
  name = cli_flags.renamed_value("model-server", "model-name", ("name",))
  if not name:
    raise ConfigError("is required: the name clients call the model by", key="--model-name")
  from tfdist.cli.models import require_model
  model, version = require_model(args[0])  # Before TensorFlow is imported: one line on stderr.
  try:
    from tfdist.serving import grpc_services, http
  except ImportError as e:
    raise MissingExtraError(f"model-server needs the serving extra and the protocols' protos: "
                            f"pip install 'tfdist[serving]' && pip install --no-deps "
                            f"tensorflow-serving-api tritonclient ({e})") from None
  from tfdist.serving.batching import BatchingPredictor
  from tfdist.serving.endpoint import Endpoint

  predictor = BatchingPredictor(model, max_batch_size=FLAGS["max-batch-size"].value,
                                max_wait_ms=FLAGS["max-wait-ms"].value,
                                max_queue=FLAGS["max-queue"].value)
  endpoint = Endpoint(predictor, name, version)
  host, body = FLAGS.host, FLAGS["max-body-bytes"].value

  async def main():
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for stop in (signal.SIGINT, signal.SIGTERM):
      loop.add_signal_handler(stop, task.cancel)
    grpc_server, grpc_port = await grpc_services.start(
        endpoint, host=host, port=FLAGS["grpc-port"].value or 0, max_message_bytes=body)
    try:
      await http.serve(endpoint, host=host, port=FLAGS.port or 0, max_body_bytes=body,
                       on_ready=lambda url: print(
                           f"tfdist model-server: serving {name} version {version} of {model} "
                           f"at {url} (HTTP: TensorFlow Serving's REST, KServe V2 at /v2) and "
                           f"grpc://{host}:{grpc_port} (TensorFlow Serving's PredictionService, "
                           f"KServe V2's GRPCInferenceService); Ctrl-C stops", flush=True))
    finally:
      await grpc_server.stop(grace=1)
  try:
    asyncio.run(main())
  except asyncio.CancelledError:
    pass
  finally:
    predictor.close()
  print("tfdist model-server: stopped", flush=True)
  return 0
