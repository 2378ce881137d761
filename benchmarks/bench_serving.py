"""Request batching: the BatchingPredictor against running each request alone, in-process at 1,
4 and 32 concurrent callers (closed loop: each caller sends its next request when answered),
and over HTTP on 127.0.0.1 (`tfdist model-server` with batches of 32 vs of 1) under a bounded
local load generator (aiohttp, 32 connections). Model: MLP 784-1024-1024-10, 1-row requests.

  python -m benchmarks.bench_serving [--seconds 3]
"""

import asyncio
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

from absl import app, flags

from benchmarks import common

flags.DEFINE_float("seconds", 3.0, "Seconds of load per measurement.")
FLAGS = flags.FLAGS


def closed_loop(call, callers: int, seconds: float):
  """(requests/s, p50 ms, p99 ms) of `callers` threads calling `call(i)` for `seconds`."""
  latencies, stop = [], time.monotonic() + seconds

  def caller(i):
    while time.monotonic() < stop:
      start = time.perf_counter()
      call(i)
      latencies.append(time.perf_counter() - start)
  threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  return _summary(latencies, seconds)


def _summary(latencies, seconds):
  latencies.sort()
  return (len(latencies) / seconds, 1000 * latencies[len(latencies) // 2],
          1000 * latencies[int(len(latencies) * 0.99)])


async def http_load(url: str, body: bytes, connections: int, seconds: float):
  import aiohttp
  latencies, stop = [], time.monotonic() + seconds
  async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections)) as session:
    async def client():
      while time.monotonic() < stop:
        start = time.perf_counter()
        async with session.post(url, data=body, headers={"Content-Type": "application/json"}) \
            as response:
          await response.read()
          assert response.status == 200, response.status
        latencies.append(time.perf_counter() - start)
    await asyncio.gather(*(client() for _ in range(connections)))
  return _summary(latencies, seconds)


def start_server(path: str, batch: int):
  server = subprocess.Popen([sys.executable, "-m", "tfdist", "model-server", path, "--name",
                             "mlp", "--max-batch-size", str(batch)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  for line in server.stdout:
    match = re.search(r"(http://127\.0\.0\.1:\d+/v1/models/mlp)", line)
    if match:
      return server, match.group(1) + ":predict"
  raise RuntimeError("the model server did not start")


def main(argv):
  del argv
  import json

  import numpy as np

  from tfdist.serving.batching import BatchingPredictor
  from tfdist.serving.model import ServedModel
  model = common.model_fn()
  x, _ = common.data(64)
  served, lock = ServedModel(model), threading.Lock()
  served.warm_up([1])
  predictor = BatchingPredictor(model, max_batch_size=32, max_wait_ms=2)

  def alone(i):
    with lock:  # One model call at a time, as a server without batching runs them.
      served.run([x[i % 64:i % 64 + 1]], 1)

  rows = ["| callers | unbatched req/s | p50 ms | p99 ms | batched req/s | p50 ms | p99 ms "
          "| req/s ratio |", "|---|---|---|---|---|---|---|---|"]
  for callers in (1, 4, 32):
    plain = closed_loop(alone, callers, FLAGS.seconds)
    batched = closed_loop(lambda i: predictor.predict(x[i % 64:i % 64 + 1]), callers,
                          FLAGS.seconds)
    rows.append(f"| {callers} | {plain[0]:,.0f} | {plain[1]:.2f} | {plain[2]:.2f} | "
                f"{batched[0]:,.0f} | {batched[1]:.2f} | {batched[2]:.2f} | "
                f"{batched[0] / plain[0]:.2f} |")
  predictor.close()
  print("In-process, closed loop:\n" + "\n".join(rows))

  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "mlp.keras")
    model.save(path)
    body = json.dumps({"instances": np.round(x[:1], 4).tolist()}).encode()
    rows = ["| server | req/s | p50 ms | p99 ms |", "|---|---|---|---|"]
    results = {}
    for label, batch in (("unbatched (max batch 1)", 1), ("batched (max batch 32)", 32)):
      server, url = start_server(path, batch)
      try:
        asyncio.run(http_load(url, body, 32, 1.0))  # Warm up.
        results[label] = asyncio.run(http_load(url, body, 32, FLAGS.seconds))
      finally:
        server.terminate()
        server.wait(30)
      rps, p50, p99 = results[label]
      rows.append(f"| {label} | {rps:,.0f} | {p50:.2f} | {p99:.2f} |")
    ratio = results["batched (max batch 32)"][0] / results["unbatched (max batch 1)"][0]
    print("\nOver HTTP on 127.0.0.1, 32 connections:\n" + "\n".join(rows) +
          f"\nbatched / unbatched requests/s: {ratio:.2f}")


if __name__ == "__main__":
  app.run(main)
