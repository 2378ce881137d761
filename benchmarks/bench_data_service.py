"""The tf.data service's roles for an input-bound job: a trainer pinned to one core whose
input's map costs more than its step, its pipeline run locally against one data worker pinned
to the other core (`tfdist data-service`, as `tfdist launch` starts it), the trainer reading
through TensorFlow's `distribute("distributed_epoch", tfdist.data_service_address(...))`.
Contenders interleaved; examples per second of the trainer's loop (input and step), median.

Measured 2026-11-28 (2 vCPUs, AMD EPYC, TF 2.21), medians of 3: local 2,443 examples/s; one
data worker reading a row-by-row source (`from_tensor_slices` of the rows) 1,349 (0.55); the
same rows from a source of 64-row chunks 2,018 (0.83). The dispatcher hands a data worker one
source element (a split) at a time: a row-by-row source pays a round trip a row (in-process
probe, 20,000 small rows: 1,986-1,990 rows/s a row a split, 7,722-9,724 in 100-row chunks).
The 1.6x goal is not met here (BUILD_NOTES.md).

  python -m benchmarks.bench_data_service [--rounds 3]
"""

import json
import os
import statistics
import subprocess
import sys
import time

from absl import app, flags

flags.DEFINE_integer("rounds", 3, "Epochs timed per contender (after one warm-up each).")
FLAGS = flags.FLAGS

_ROWS, _BATCH, _CHUNK = 4096, 64, 64
_MAP_PRODUCTS = 30  # ~40 ms of input a batch on one core: the service moves a batch in ~11 ms.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _augment(x):
  """An input map costing more than the step: a few small matrix products per example."""
  import tensorflow as tf
  m = tf.reshape(tf.tile(x, [16]), (64, 64))
  for _ in range(_MAP_PRODUCTS):
    m = tf.tanh(tf.linalg.matmul(m, m) / 64.0)
  return tf.reshape(m[:16, :16], (256,))


def _timed_epochs(dataset, step, rounds: int) -> list[float]:
  seconds = []
  for epoch in range(rounds + 1):
    began, rows = time.perf_counter(), 0
    for batch in dataset:
      step(batch)
      rows += int(batch.shape[0])
    if epoch:  # The first warms up (tracing, the service's first job).
      seconds.append(rows / (time.perf_counter() - began))
  return seconds


def main(argv):
  del argv
  import portpicker
  import numpy as np
  import tensorflow as tf
  import tfdist
  os.sched_setaffinity(0, {0})  # The trainer: one core.
  dispatcher, worker = (f"127.0.0.1:{portpicker.pick_unused_port()}" for _ in range(2))
  config = tfdist.load_config({"cluster": {"worker": [f"127.0.0.1:{portpicker.pick_unused_port()}"],
                                           "dispatcher": [dispatcher], "data_worker": [worker]}},
                              environ={})
  servers = [subprocess.Popen(
      ["taskset", "-c", cpu, sys.executable, "-m", "tfdist", "data-service", "--task", task],
      env={**os.environ, "PYTHONPATH": _REPO, "TF_CPP_MIN_LOG_LEVEL": "3",
           "TF_CONFIG": json.dumps({"cluster": {"worker": list(
               config.cluster.addresses["worker"])}, "task": {"type": task.split(":")[0],
                                                               "index": 0}}),
           "TFDIST_DATA_SERVICE": json.dumps(
               {"dispatcher": [dispatcher], "data_worker": [worker]})},
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
      for task, cpu in (("dispatcher:0", "0"), ("data_worker:0", "1"))]
  try:
    rng = np.random.default_rng(0)
    x = rng.random((_ROWS, 256), dtype=np.float32)
    weights = tf.Variable(rng.random((256, 256), dtype=np.float32) / 256)

    @tf.function
    def step(batch):
      h = batch
      for _ in range(24):  # A step cheaper than the batch's input, as in an input-bound job.
        h = tf.tanh(tf.linalg.matmul(h, weights))
      weights.assign_sub(1e-6 * tf.linalg.matmul(batch, h, transpose_a=True))

    elements = tf.data.Dataset.from_tensor_slices(x).map(_augment)
    # The same rows from a source of 64-row chunks: the dispatcher hands a data worker one
    # source element (a "split") at a time, so a row-by-row source costs a round trip a row.
    chunked = tf.data.Dataset.from_tensor_slices(x.reshape(-1, _CHUNK, x.shape[1])).flat_map(
        tf.data.Dataset.from_tensor_slices).map(_augment)
    service = tf.data.experimental.service.distribute("distributed_epoch",
                                                      tfdist.data_service_address(config))
    # Batched on the data worker: one transfer a batch.
    contenders = {"local pipeline (one core)": elements.batch(_BATCH).prefetch(2),
                  "one data worker, a row a split": elements.batch(_BATCH).apply(
                      service).prefetch(2),
                  f"one data worker, {_CHUNK} rows a split": chunked.batch(_BATCH).apply(
                      service).prefetch(2)}
    figures = {name: [] for name in contenders}
    for _ in range(FLAGS.rounds):
      for name, dataset in contenders.items():
        figures[name] += _timed_epochs(dataset, step, 1)
    base = statistics.median(figures["local pipeline (one core)"])
    print("| contender | median examples/s | runs | ratio |\n|---|---|---|---|")
    for name, runs in figures.items():
      median = statistics.median(runs)
      print(f"| {name} | {median:,.0f} | {', '.join(f'{r:,.0f}' for r in runs)} | "
            f"{median / base:.2f} |")
  finally:
    for server in servers:
      server.kill()
      server.wait()


if __name__ == "__main__":
  app.run(main)
