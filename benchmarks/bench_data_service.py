"""The tf.data service's roles for an input-bound job: a trainer pinned to one core whose
input's map costs more than its step (1.2x the step's time a row, calibrated on the core
before the contenders run: `_calibrated_map_products`), its pipeline run
locally against one data worker pinned to the other core (`tfdist data-service`, as `tfdist
launch` starts it), read by tfdist's reader (`reading.served`, as `tfdist.fit` reads) and by
TensorFlow's public `distribute("distributed_epoch", ...)`. Contenders interleaved; examples
per second of the trainer's loop (input and step) over an epoch of 8,192 rows, median.

Before the calibration (a fixed map of 10 products, ~7,000 examples/s, against a step of
~8,500 on the CPUs of 2026-11-28; on a core twice as fast the map cost less than the step
and two trainers gained 1.02x):

Measured 2026-11-28 (2 vCPUs, AMD EPYC, TF 2.21), medians of 3: local 3,206 examples/s;
tfdist's reader 6,082 (**1.90x**); TensorFlow's `distribute()` 4,040 (1.26x): its reader
learns that a pass ended at its next question to the dispatcher, a second after the job
began, so each epoch waits ~0.7 s after its last batch (`reading.TASK_REFRESH_MS`). A source
of single rows instead of 512-row chunks costs a dispatcher round trip a row (0.55x before).

With `--trainers 2`: two trainers, processes sharing the first core, each training on half of
each epoch: locally each runs its own half's pipeline, served they share one pass
(one `distributed_epoch` job per epoch, as `tfdist.fit`'s trainers share it) from the data
worker on the other core. Examples per second of both together over each epoch (the rows both
trained on from the first one's start to the last one's end).

Measured 2026-11-29 (2 vCPUs, Intel Xeon), medians of 3: one trainer: local 3,139, tfdist's
reader 6,219 (**1.98x**), `distribute()` 3,896 (1.24x); two trainers: local 3,155, one data
worker shared by both through tfdist's reader 6,382 (**2.02x**).

With the map calibrated (2026-11-29, 2 vCPUs, Intel Xeon, cores ~2x faster than the day
before; 8 products an example), medians of 3: one trainer: local 7,711, tfdist's reader 12,310
(**1.60x**), `distribute()` 6,366 (0.83x); two trainers: 6,215 and 6,426 (1.03x; runs 6,124,
6,426, 10,438: one trainer's timed epoch began while the other still warmed up). With both
trainers waiting for each other's warm-up (`_both_warm`): local 6,346, one data worker shared
10,741 (**1.69x**; runs 10,741, 6,398, 10,820).

  python -m benchmarks.bench_data_service [--rounds 3] [--trainers 2] [--map_products K]
"""

import json
import os
import statistics
import subprocess
import sys
import time

from absl import app, flags

flags.DEFINE_integer("rounds", 3, "Epochs timed per contender (after one warm-up each).")
flags.DEFINE_integer("trainers", 1, "Trainers (processes on the first core): 1 or 2.")
flags.DEFINE_string("as_trainer", None, "Internal: run as trainer INDEX of CONTENDER "
                    "(INDEX:CONTENDER:TOKEN:SERVICE), printing each epoch's rows and seconds.")
flags.DEFINE_integer("map_products", 0, "The input map's matrix products per example; 0: "
                     "calibrated so the map costs MAP_OVER_STEP times the step a row.")
FLAGS = flags.FLAGS

_ROWS, _BATCH, _CHUNK = 8192, 64, 512
_MAP_PRODUCTS = 10  # The input's map, per example: set by `_calibrated_map_products`.
_STEP_PRODUCTS = 70  # The step's products per batch.
MAP_OVER_STEP = 1.2
"""The map's time a row over the step's: the trainer alone is input-bound by this much, and one
data worker on another core serves it faster than its own core maps (at most
(1 + MAP_OVER_STEP) / MAP_OVER_STEP, 1.83x)."""
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _augment(x):
  """An input map costing more than the step: a few small matrix products per example."""
  import tensorflow as tf
  m = tf.reshape(tf.tile(x, [16]), (64, 64))
  for _ in range(_MAP_PRODUCTS):
    m = tf.tanh(tf.linalg.matmul(m, m) / 64.0)
  return tf.reshape(m[:16, :16], (256,))


def _calibrated_map_products() -> int:
  """The map's products per example that make it cost `MAP_OVER_STEP` times the step a row on
  this core: the step and the map at 2 and 12 products timed (the map's cost is linear in its
  products past a fixed part), best of 3 each."""
  import numpy as np
  import tensorflow as tf
  global _MAP_PRODUCTS
  _, step = _job()
  batch = tf.constant(np.random.default_rng(1).random((_BATCH, 256), dtype=np.float32))

  def best(run) -> float:
    times = []
    for _ in range(3):
      began = time.perf_counter()
      run()
      times.append(time.perf_counter() - began)
    return min(times)
  step(batch)  # Traced.
  step_row = best(lambda: [step(batch) for _ in range(32)]) / (32 * _BATCH)
  rows = tf.data.Dataset.from_tensor_slices(np.ones((1024, 256), np.float32))
  map_row = {}
  for products in (2, 12):
    _MAP_PRODUCTS = products
    mapped = rows.map(_augment).batch(_BATCH)
    map_row[products] = best(lambda mapped=mapped: [None for _ in mapped]) / 1024
  per_product = max(1e-12, (map_row[12] - map_row[2]) / 10)
  fixed = max(0.0, map_row[2] - 2 * per_product)
  return max(1, round((MAP_OVER_STEP * step_row - fixed) / per_product))


def _timed_epochs(dataset, step, rounds: int, warmed=lambda: None
                  ) -> list[tuple[int, float, float]]:
  """Each timed epoch's rows, start and end (wall clock, comparable across processes), after
  a first that warms up (tracing, the service's first job); `warmed()` runs between them."""
  epochs = []
  for epoch in range(rounds + 1):
    if epoch == 1:
      warmed()
    began, rows = time.time(), 0
    for batch in dataset:
      step(batch)
      rows += int(batch.shape[0])
    epochs.append((rows, began, time.time()))
  return epochs[1:]


def _job(rows: slice = slice(None)):
  """The trainer's step and its input (chunked rows of `rows`, mapped, batched)."""
  import numpy as np
  import tensorflow as tf
  rng = np.random.default_rng(0)
  x = rng.random((_ROWS, 256), dtype=np.float32)
  weights = tf.Variable(rng.random((256, 256), dtype=np.float32) / 256)

  @tf.function
  def step(batch):
    h = batch
    for _ in range(_STEP_PRODUCTS):  # Cheaper than the batch's input: input-bound.
      h = tf.tanh(tf.linalg.matmul(h, weights))
    weights.assign_sub(1e-6 * tf.linalg.matmul(batch, h, transpose_a=True))

  # Rows from a source of 512-row chunks: the dispatcher hands a data worker one source
  # element (a "split") at a time, and a row-by-row source costs a round trip a row.
  chunked = tf.data.Dataset.from_tensor_slices(x[rows].reshape(-1, _CHUNK, x.shape[1])).flat_map(
      tf.data.Dataset.from_tensor_slices).map(_augment).batch(_BATCH)  # Batched where mapped.
  return chunked, step


def _trainer(spec: str) -> None:
  """One of two trainers (`--as_trainer`): prints `EPOCH <json [rows, began, ended]>` for its
  timed epoch."""
  import tensorflow as tf
  from tfdist.data_service import reading
  global _MAP_PRODUCTS
  _MAP_PRODUCTS = FLAGS.map_products
  index, contender, token, service = spec.split(":", 3)
  half = _ROWS // 2
  if contender == "local":
    dataset, step = _job(slice(int(index) * half, (int(index) + 1) * half))
    dataset = dataset.prefetch(2)
  else:
    dataset, step = _job()
    dataset = reading.served(dataset, strategy=tf.distribute.get_strategy(), service=service,
                             global_batch=_BATCH, token=int(token))
  print("EPOCH " + json.dumps(_timed_epochs(dataset, step, 1, warmed=lambda: _both_warm(
      token, int(index)))[0]), flush=True)


def _both_warm(token: str, index: int) -> None:
  """Waits until both trainers finished their warm-up epoch (a file each, by `token`), so their
  timed epochs start together: one starting its timed epoch while the other still traced
  stretched the pair's window (runs 0.99-1.68x before)."""
  import tempfile
  mark = os.path.join(tempfile.gettempdir(), f"bench_data_service.{token}.{{}}")
  open(mark.format(index), "w").close()
  while not os.path.exists(mark.format(1 - index)):
    time.sleep(0.01)


def _two_trainers(contender: str, service: str) -> float:
  """Examples per second of two trainers (processes on the first core) over their timed epoch,
  together: the rows both trained on over the time from the first's start to the last's end."""
  from tfdist.data_service import reading
  token = reading.new_token()
  trainers = [subprocess.Popen(
      ["taskset", "-c", "0", sys.executable, "-m", "benchmarks.bench_data_service",
       f"--as_trainer={index}:{contender}:{token}:{service}",
       f"--map_products={_MAP_PRODUCTS}"],
      env={**os.environ, "PYTHONPATH": _REPO, "TF_CPP_MIN_LOG_LEVEL": "3"}, cwd=_REPO,
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for index in range(2)]
  epochs = []
  for trainer in trainers:
    out, _ = trainer.communicate(timeout=600)
    lines = [json.loads(l.split(" ", 1)[1]) for l in out.splitlines() if l.startswith("EPOCH ")]
    assert trainer.returncode == 0 and len(lines) == 1, (trainer.returncode, out[-2000:])
    epochs += lines
  import glob
  import tempfile
  for mark in glob.glob(os.path.join(tempfile.gettempdir(), f"bench_data_service.{token}.*")):
    os.remove(mark)
  rows = sum(e[0] for e in epochs)
  assert rows == _ROWS, rows  # Both halves, or the one pass both shared.
  return rows / (max(e[2] for e in epochs) - min(e[1] for e in epochs))


def main(argv):
  del argv
  if FLAGS.as_trainer:
    _trainer(FLAGS.as_trainer)
    return
  import portpicker
  import tensorflow as tf
  import tfdist
  from tfdist.data_service import reading
  os.sched_setaffinity(0, {0})  # The trainer: one core.
  global _MAP_PRODUCTS
  _MAP_PRODUCTS = FLAGS.map_products or _calibrated_map_products()
  print(f"The input's map: {_MAP_PRODUCTS} products an example "
        f"({'given' if FLAGS.map_products else f'calibrated to {MAP_OVER_STEP}x the step'}).\n")
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
  service = tfdist.data_service_address(config)
  try:
    if FLAGS.trainers == 2:
      contenders = {"two trainers, local pipelines (one core)": "local",
                    "two trainers, one data worker, tfdist's reader": "served"}
      figures = {name: [] for name in contenders}
      for _ in range(FLAGS.rounds):
        for name, contender in contenders.items():
          figures[name].append(_two_trainers(contender, service))
    else:
      chunked, step = _job()
      strategy = tf.distribute.get_strategy()
      datasets = {
          "local pipeline (one core)": chunked.prefetch(2),
          "one data worker, tfdist's reader": reading.served(
              chunked, strategy=strategy, service=service, global_batch=_BATCH,
              token=reading.new_token()),
          "one data worker, TensorFlow's distribute()": chunked.apply(
              tf.data.experimental.service.distribute("distributed_epoch", service)).prefetch(2)}
      figures = {name: [] for name in datasets}
      for _ in range(FLAGS.rounds):
        for name, dataset in datasets.items():
          figures[name] += [rows / (ended - began)
                            for rows, began, ended in _timed_epochs(dataset, step, 1)]
    base = statistics.median(next(iter(figures.values())))
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
