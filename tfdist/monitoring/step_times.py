"""Where each worker's step time goes, and the slow worker named.

Synchronous all-reduce makes every worker's steps/s the same (a worker slowed by 50 ms a batch
and its peer both show ~20 steps/s), so a straggler shows only in how each worker spends a step:

  input wait        the step waited for the worker's own input pipeline;
  compute           forward, backward and update on this worker;
  collective wait   the step waited for its peers: in the all-reduce of the gradients, and in
                    the distributed iterator's cross-worker "has data" check.

A timestamp (float64, one per example) is appended to each batch as it leaves the user's
pipeline: a batch stamped after the step asked for it was waited for (input); one stamped before
was ready, and the time `get_next` still took was spent waiting for peers. Timestamps around the
gradients' all-reduce give its share. The straggler ratio is the slowest worker's input+compute
over the median of all workers'; above `STRAGGLER_RATIO` (and `STRAGGLER_MS` behind) the worker
is named.

```python
clock = StepClock()
dataset = clock.stamped(dataset)            # before the strategy distributes it
step = clock.timed(model.train_step)        # inside strategy.run: data, requested_at
```
"""

from __future__ import annotations

import dataclasses
import statistics
import threading

import tensorflow as tf

import tfdist.progress as progress
from tfdist.strategy import gradient_reduction

STRAGGLER_RATIO = 1.3  # Megatron's straggler detector flags ranks ~1.3x slower than the median.
STRAGGLER_MS = 1.0  # And at least this much slower: 0.3 ms against 0.2 ms is noise, not a lag.
INPUT_BOUND = 0.5
"""A job is input-bound when a worker's steps wait for its input at least this share of their
time: more than its forward, backward, update and all-reduce together. Synchronous workers go
at the pace of the slowest, so one such worker bounds the job."""
PARTS = ("input_wait", "compute", "collective_wait")
DETERMINISM_NOTICE = ("tfdist: op determinism is on: the step-time split (epoch_input_wait_ms, "
                      "epoch_compute_ms, epoch_collective_wait_ms) and the straggler line are off; "
                      "they need tf.timestamp, which determinism refuses")


def determinism_enabled() -> bool:
  """Whether `tf.config.experimental.enable_op_determinism()` was called in this process: it
  refuses `tf.timestamp`, which the step clock runs in the graph."""
  from tensorflow.python.framework import config  # No public reader of the switch in TF 2.21.
  return bool(getattr(config, "is_op_determinism_enabled", lambda: False)())


class StepClock:
  """Per-task totals of (input wait, compute, collective wait, steps) in seconds, measured in the
  graph; a plain (not mirrored) variable, made outside any strategy's scope."""

  def __init__(self):
    with tf.init_scope():
      self.totals = tf.Variable(tf.zeros([4], tf.float64), trainable=False, name="step_times")
    self._reduces = {}  # Thread (replica) -> [(before, after)] traced in its current step.

  def stamped(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
    """`dataset` with each batch `(batch, produced_at)`: a float64 timestamp per example (the
    strategy splits every component of a batch over the replicas)."""
    def stamp(*element):
      element = element[0] if len(element) == 1 else element
      examples = tf.shape(tf.nest.flatten(element)[0])[:1]
      return element, tf.fill(examples, tf.timestamp())
    return dataset.map(stamp)

  def timed(self, step_function):
    """`step_function(data)` as `timed(stamped_data, requested_at)`: runs the step on the
    unstamped data and adds its input, compute and collective times to `totals`."""
    def step(stamped, requested_at):
      data, produced_at = stamped
      with tf.control_dependencies(tf.nest.flatten(data)):
        received_at = tf.timestamp()
      ready_at = tf.reduce_max(tf.concat([produced_at, [requested_at]], 0))
      input_wait = ready_at - requested_at
      self._reduces[threading.get_ident()] = []
      outputs = step_function(data)
      with tf.control_dependencies(tf.nest.flatten(outputs)):
        ended_at = tf.timestamp()
      reduces = self._reduces.pop(threading.get_ident())
      all_reduce = tf.add_n([after - before for before, after in reduces]) if reduces else \
          tf.constant(0.0, tf.float64)
      collective = received_at - requested_at - input_wait + all_reduce
      compute = ended_at - received_at - all_reduce
      record = self.totals.assign_add(tf.stack([input_wait, compute, collective, 1.0]))
      with tf.control_dependencies([record]):
        return tf.nest.map_structure(tf.identity, outputs)
    return step

  def time_all_reduce(self, optimizer) -> None:
    """Times `optimizer`'s all-reduce of the gradients (Keras's, or tfdist's compressed one)."""
    clock = self

    def timed_reduce(reduce, grads_and_vars):
      grads_and_vars = list(grads_and_vars)
      grads = [g for g, _ in grads_and_vars if g is not None]
      with tf.control_dependencies(grads):
        before = tf.timestamp()
      with tf.control_dependencies([before]):
        reduced = reduce([(tf.identity(g) if g is not None else g, v)
                          for g, v in grads_and_vars])
      with tf.control_dependencies([g for g, _ in reduced if g is not None]):
        after = tf.timestamp()
      clock._reduces.setdefault(threading.get_ident(), []).append((before, after))
      return reduced
    gradient_reduction.wrap(optimizer, timed_reduce)

  def take(self) -> list[float]:
    """This task's mean (input wait, compute, collective wait) per step in ms since the last
    call, and resets the totals."""
    *seconds, steps = self.totals.numpy().tolist()
    self.totals.assign(tf.zeros([4], tf.float64))
    return [1000 * s / max(steps, 1.0) for s in seconds]


def gathered(strategy, mine: list[float], task_name: str,
             gather=None) -> dict[str, list[float]]:
  """{task name: its `mine`} of every worker (all workers call this together: under
  MultiWorkerMirrored it is a collective). `task_name` is "chief-0" or "worker-N" (a
  `TaskConfig.name`); `gather`, the `tf.function` of `strategy.gather` to reuse (see
  `StepTimes`)."""
  kind, _, index = task_name.rpartition("-")
  row = tf.constant([[*mine, int(index) if kind == "worker" else -1]], tf.float64)
  local = strategy.experimental_distribute_values_from_function(lambda _: row)
  rows = (gather or _gather_function(strategy))(local).numpy().tolist()
  chief = task_name if kind != "worker" else "chief-0"
  # Several local replicas give the same row.
  return {(chief if number < 0 else f"worker-{int(number)}"): values
          for *values, number in rows}


def _gather_function(strategy):
  # One tf.function for every epoch's gather: called eagerly, MultiWorkerMirrored's
  # `_batch_all_gather` makes a new tf.function each time, and TensorFlow warns of "5 out of the
  # last 5 calls ... triggered tf.function retracing" by the fifth epoch.
  return tf.function(lambda local: strategy.gather(local, axis=0))


class Stragglers:
  """Names the straggler of each epoch and counts how often each task was one."""

  def __init__(self):
    self.epochs, self.counts = 0, {}

  def line(self, rows: dict[str, list[float]]) -> tuple[str, float, bool]:
    """(the epoch's straggler line, the ratio, whether a task was named)."""
    self.epochs += 1
    name, ratio = straggler(rows)
    if name:
      self.counts[name] = self.counts.get(name, 0) + 1
    return describe(name, ratio, rows, self.counts.get(name, 0), self.epochs), ratio, bool(name)


def straggler(rows: dict[str, list[float]]) -> tuple[str | None, float]:
  """(the straggler's name or None, the ratio of the slowest task's input+compute time to the
  median of all tasks'), from {task name: [input, compute, collective]}. Pure.

  >>> straggler({"worker-0": [0, 5, 60], "worker-1": [55, 5, 2]})
  ('worker-1', 1.8461538461538463)
  """
  if len(rows) < 2:
    return None, 1.0
  busy = {name: values[0] + values[1] for name, values in rows.items()}
  slowest = max(busy, key=busy.get)
  median = statistics.median(busy.values())
  ratio = busy[slowest] / median if median > 0 else 1.0
  lagging = ratio > STRAGGLER_RATIO and busy[slowest] - median > STRAGGLER_MS
  return (slowest if lagging else None), ratio


def _slowest(rows: dict[str, list[float]]) -> str:
  return max(rows, key=lambda name: rows[name][0] + rows[name][1])


def describe(name: str | None, ratio: float, rows: dict[str, list[float]], chronic: int,
             epochs: int) -> str:
  """The straggler line for the terminal and TensorBoard. Pure."""
  if name is None:
    return f"no straggler (slowest input+compute {ratio:.2f}x the median)"
  input_wait, compute, _ = rows[name]
  return (f"straggler: {name}, input+compute {input_wait + compute:.1f} ms a step "
          f"({input_wait:.1f} input, {compute:.1f} compute), {ratio:.2f}x the median; "
          f"{'chronic' if chronic > 1 else 'first time'}: {chronic} of {epochs} epochs")


def input_share(rows: dict[str, list[float]]) -> float:
  """The largest share of a worker's step time spent waiting for its input, from {task name:
  [input, compute, collective]}. Pure.

  >>> input_share({"worker-0": [6, 2, 2], "worker-1": [8, 1, 1], "worker-2": [1, 4, 5]})
  0.8
  """
  return max((values[0] / sum(values) if sum(values) > 0 else 0.0
              for values in rows.values()), default=0.0)


@dataclasses.dataclass(frozen=True)
class Host:
  """This task's host, as the advice needs it: its CPU cores and the cluster's processes on
  it (None: unknown, a cluster whose tasks' hosts are not all known)."""
  cores: int
  processes: int | None

  @property
  def busy(self) -> bool:
    """Every core runs one of the cluster's processes: another would take a core from them."""
    return self.processes is not None and self.processes >= self.cores


def input_bound_line(share: float, data_workers: int, host: Host | None = None) -> str:
  """What to say of an input-bound epoch (`share`: `input_share`'s), with the tf.data service's
  `data_workers` (0: none), fitted to the `host` it runs on: no "add data workers" where every
  core already runs a task. Pure."""
  head = f"input-bound: the steps waited for their input {share:.0%} of their time"
  busy = host is not None and host.busy
  cores = f"this host's {host.cores} cores run {host.processes} of the cluster's processes" \
      if busy else ""
  if data_workers and busy:
    return (f"{head}; {data_workers} data worker{'s' * (data_workers != 1)} run the pipeline, "
            f"and {cores}: more data workers here would not help; run them on other hosts, "
            "or make the pipeline cheaper")
  if data_workers:
    return (f"{head}; {data_workers} data worker{'s' * (data_workers != 1)} run the pipeline: "
            "add more (cluster.data_worker)")
  if busy:
    return (f"{head}, and {cores}: make the pipeline cheaper, or run it on tf.data service "
            "data workers on other hosts (cluster.dispatcher and cluster.data_worker)")
  return (f"{head}: run the input pipeline on tf.data service data workers (cluster.dispatcher "
          "and cluster.data_worker), or make it cheaper")


def input_waits_line(name: str, ratio: float, rows: dict[str, list[float]]) -> str:
  """The straggler line of a task behind because it waited for the tf.data service's batches
  (its input wait longer than its compute): an input wait, not a slow worker. Pure."""
  input_wait, compute, _ = rows[name]
  return (f"input waits, not a slow worker: {name} waited {input_wait:.1f} ms a step for its "
          f"batches from the tf.data service (compute {compute:.1f} ms), {ratio:.2f}x the "
          "median's input+compute")


class StepTimes:
  """Writes this task's step-time split each epoch and, on the chief, the straggler and
  whether the job is input-bound.

  Args:
    clock: the `StepClock` timing this task's steps.
    strategy: the strategy the steps run under (gathers every worker's split).
    task_name: this task's name ("worker-1", a `TaskConfig.name`).
    chief: whether this task writes the straggler's scalars and line.
    data_workers: the tf.data service's data workers running the input (0: none).
  """

  def __init__(self, clock: StepClock, strategy, task_name: str, chief: bool,
               data_workers: int = 0, host: Host | None = None):
    self.clock, self.strategy, self.task_name, self.chief = clock, strategy, task_name, chief
    self.data_workers, self.host, self._said_bound = data_workers, host, False
    self.stragglers = Stragglers()
    self._gather = _gather_function(strategy)

  def reset(self) -> None:
    self.clock.take()

  def write(self, epoch: int) -> None:
    """Inside a summary writer's default: this epoch's scalars (a collective: every task)."""
    mine = self.clock.take()
    for part, milliseconds in zip(PARTS, mine):
      tf.summary.scalar(f"epoch_{part}_ms", milliseconds, step=epoch)
    with progress.collective(progress.Collective.STEP_TIMES):
      rows = gathered(self.strategy, mine, self.task_name, self._gather)
    if not self.chief:
      return
    line, ratio, named = self.stragglers.line(rows)
    waited = named and self.data_workers and rows[_slowest(rows)][0] > rows[_slowest(rows)][1]
    if waited:  # The service's batches came late: an input wait, said as one.
      line = input_waits_line(_slowest(rows), ratio, rows)
    tf.summary.scalar("epoch_straggler_ratio", ratio, step=epoch)
    tf.summary.text("straggler", line, step=epoch)
    if named:
      print(f"tfdist: epoch {epoch + 1}: {line}", flush=True)
    share = input_share(rows)
    tf.summary.scalar("epoch_input_share", share, step=epoch)
    tf.summary.scalar("data_workers", self.data_workers, step=epoch)  # Runs compared by it.
    bound = share >= INPUT_BOUND
    if bound:
      tf.summary.text("input_bound", input_bound_line(share, self.data_workers, self.host),
                      step=epoch)
    if bound and not self._said_bound:  # Once, and again after epochs that were not.
      print(f"tfdist: epoch {epoch + 1}: "
            f"{input_bound_line(share, self.data_workers, self.host)}", flush=True)
    self._said_bound = bound
