"""A training's batches read through the launch's tf.data service, each epoch one pass over the
user's dataset that every trainer shares.

Measured on TensorFlow 2.21 (BUILD_NOTES.md, "The tf.data service's roles"), and what follows:
- A `distributed_epoch` job hands each element of the pass to one reader, once. Trainers read
  one job by its name; each new iterator (each Keras epoch, Keras's own first look at the data
  included) takes a new name, so a pass is never read twice and never shared across epochs.
  The name is counted in the dataset itself, at the iterator's first read: every trainer counts
  the same iterators, so their names agree without a collective a step.
- Each read element is one replica's batch: the dataset's global batches are cut into the
  replicas' pieces on the data workers (`rebatch`). A data worker's stream ends in a short
  piece, and trainers read unequal shares of a pass: tf.distribute's own end-of-data agreement
  (one all-reduce of "has data" a step, under multi-worker strategies) keeps their steps equal,
  and a trainer with none left takes an empty batch.
- A trainer that stops reading a job early (a quota, `take(n)`) drops the elements it had
  fetched and not read: lost to the others (98 of 100 read in one pass, measured). So each
  trainer reads its job to its end.
- A reader fetches ahead: by default the whole of a small pass (one reader took all 12
  batches of a pass after reading one), and 3 with `max_outstanding_requests=1` and no
  prefetch injected after it (4 with one).
  Readers that do not step together (`endless_passes`) read with 1: what one of them holds of
  a pass while another moves on to the next is what an epoch of steps can take twice.
"""

from __future__ import annotations

import contextlib
import re
from typing import Callable

from tfdist.errors import ConfigError

JOB_PREFIX = "tfdist"
TASK_REFRESH_MS = 100
"""How often a reader asks the dispatcher about its job. A pass ends for a reader only when it
next asks: at TensorFlow's own interval (a second) every epoch's last batch was followed by
0.7 s of waiting for the end (a 0.3 s pass read in 1.03 s; 0.32 s at 100 ms; TF 2.21).
`tests/test_data_service.py` tells when TensorFlow's own is quick."""


def served(dataset, *, strategy, service: str, global_batch: int, token: int,
           then: Callable | None = None, passes: str = "shared"):
  """`dataset`'s global batches read through the tf.data service, as `strategy`'s replicas
  take them: each Keras epoch one pass (one `distributed_epoch` job) shared by every trainer,
  or with `passes="per_trainer"` one pass for each trainer (each reads a whole pass).

  Args:
    dataset: a `tf.data.Dataset` of global batches (batched by `global_batch`).
    strategy: the strategy the batches are for.
    service: the dispatcher, "grpc://host:port" (`tfdist.data_service_address()`).
    global_batch: the batch `dataset` yields; each replica reads pieces of
      `global_batch // strategy.num_replicas_in_sync`.
    token: a number every trainer of this run holds alike and a restarted run holds anew
      (its jobs are then new).
    then: a last transformation of each trainer's stream (e.g. counting what it reads).
    passes: "shared" or "per_trainer" (`data_service.passes`).

  Returns:
    A `tf.distribute.DistributedDataset` of per-replica batches; finite: one pass per
    iterator.

  Example:

  ```python
  # In a launched task (the dispatcher running), under a strategy:
  stream = served(dataset, strategy=strategy, service=tfdist.data_service_address(),
                  global_batch=64, token=agreed_token)
  model.fit(stream, epochs=3)
  ```
  """
  import tensorflow as tf
  from tensorflow.python.ops import resource_variable_ops

  pieces = dataset.rebatch(global_batch // strategy.num_replicas_in_sync)
  with tf.init_scope(), tf.device("/cpu:0"):  # A plain counter, outside any strategy.
    reads = resource_variable_ops.ResourceVariable(0, dtype=tf.int64, trainable=False,
                                                   name="tfdist_data_service_reads")

  def per_trainer(context):
    # Shared: every trainer reads the same jobs, which the service splits among them.
    kind = "read" if passes == "shared" else f"trainer{context.input_pipeline_id}-read"
    one_pass = _passes(pieces, service, token, kind)
    # Counted when the iterator first reads.
    stream = tf.data.Dataset.from_tensors(0).flat_map(lambda _: one_pass(reads.assign_add(1)))
    return then(stream) if then else stream

  return strategy.distribute_datasets_from_function(per_trainer)


def new_token() -> int:
  """A random number naming a run's jobs, below 2**24 (exact in a float32 all-reduce)."""
  import random
  return random.SystemRandom().randrange(1, 2 ** 24)


def endless_passes(dataset, *, service: str):
  """`dataset`'s elements read through the tf.data service as one endless stream of passes:
  pass n is the job every reader shares under one name, each element of it reaching one
  reader once. For readers that do not step together (a parameter-server cluster's workers,
  each reading its own stream, which the coordinator rebuilds on each from this graph): each
  reads every pass to its end before the next, so all of them count passes alike.

  Args:
    dataset: a `tf.data.Dataset` (its elements are what each step takes).
    service: the dispatcher, "grpc://host:port". Made in one process (the coordinator), the
      stream's jobs are named by a number drawn here: a restarted run reads new ones.

  Returns:
    An endless `tf.data.Dataset`.
  """
  import tensorflow as tf
  options = tf.data.Options()  # No prefetch of tf.data's own after the reader: it would hold
  options.experimental_optimization.inject_prefetch = False  # more of a pass.
  return tf.data.Dataset.counter().flat_map(
      _passes(dataset, service, new_token(), "pass", fetched_ahead=1)).with_options(options)


def _passes(dataset, service: str, token: int, kind: str, fetched_ahead: int | None = None):
  """`dataset` registered with the service under this run's name; returns a function of a
  number (a tensor) giving pass `<kind>-<number>` of it: the `distributed_epoch` job every
  reader of that name shares, each reader with at most `fetched_ahead` requests outstanding
  (None: TensorFlow's, as many as its buffer holds)."""
  import tensorflow as tf
  from tensorflow.python.data.experimental.ops import data_service_ops
  name = f"{JOB_PREFIX}-{token}"
  dataset_id = tf.data.experimental.service.register_dataset(service, dataset, dataset_id=name)

  def one_pass(number):
    # The public `from_dataset_id` takes a job name of Python's str only; its own
    # implementation, called here, takes a tensor.
    return data_service_ops._from_dataset_id(
        "distributed_epoch", service, dataset_id, dataset.element_spec,
        job_name=tf.strings.join([name, f"-{kind}-", tf.strings.as_string(number)]),
        max_outstanding_requests=fetched_ahead, task_refresh_interval_hint_ms=TASK_REFRESH_MS)
  return one_pass


_FORGOTTEN = re.compile(r"The dispatcher is not configured to be fault tolerant|"
                        r"Failed to get split: Iteration id \d+ not found")
"""TensorFlow's words for a dispatcher that restarted without its journal: to a reader asking
about its job, or (as a suite on 2 busy cores once saw first) to a data worker asking it for
the next split of the pass."""


@contextlib.contextmanager
def dispatcher_restarts_explained():
  """Turns TensorFlow's error for a dispatcher that restarted without its journal (and so
  forgot the jobs being read) into one line saying what to set."""
  import tensorflow as tf
  try:
    yield
  except tf.errors.NotFoundError as e:
    if not _FORGOTTEN.search(str(e)):
      raise
    raise ConfigError("the tf.data service's dispatcher restarted and forgot the jobs being "
                      "read (it keeps them in memory only): set data_service.work_dir, a "
                      "directory it can write, and a restarted dispatcher recovers them",
                      key="data_service.work_dir", received=None) from None
