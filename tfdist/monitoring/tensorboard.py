"""TensorBoard for a whole cluster: one set of curves per run, written once.

Keras's TensorBoard callback knows no chief: two MultiWorkerMirrored workers writing one
`train/` directory give TensorBoard duplicate, zig-zag curves (no two writers may share a run
directory, tensorflow/tensorboard#1011). The config's `tensorboard:` section gives, under
`<log_dir>/<run>/` (`<run>` is the launch's name, `TFDIST_RUN`, else `local`):

  train/, validation/   the chief's Keras curves (update_freq), its throughput, FLOP/s and MFU
  <task>/               every other task's own throughput scalars (examples/s, steps/s)

Batch-level steps count optimizer steps, not calls of `steps_per_execution` steps, and a
resumed run continues its steps where the backup left off: a restart is a new segment of the
same curve, not a second curve from step 0. `profile_batches: [first, last]` profiles those
batches (on the chief, or on every task with `profile_every_task: true`) into the run, where
TensorBoard's profile plugin opens them.

```yaml
tensorboard: {log_dir: /shared/logs, update_freq: batch, profile_batches: [5, 8]}
```
"""

from __future__ import annotations

import os
import time

import keras
import tensorflow as tf

from tfdist.config.loader import RUN_ENV
from tfdist.config.roles import is_chief, task_name, tasks_on_this_host
from tfdist.config.schema import Config
from tfdist.machine import speed
from tfdist.monitoring import step_times


def run_dir(config: Config, environ=os.environ) -> str:
  """`<log_dir>/<run>`: where this run's event files go."""
  return os.path.join(config.tensorboard.log_dir, environ.get(RUN_ENV) or "local")


def callbacks(config: Config, strategy, *, first_epoch: int, epoch_steps: int | None,
              global_batch: int | None, clock: step_times.StepClock | None = None) -> list:
  """The TensorBoard callbacks of this task: the chief's Keras curves and its throughput, or
  another task's throughput alone; none without `tensorboard.log_dir`. With the `clock` timing
  this task's steps, also where its step time goes and (on the chief) the straggler."""
  if not config.tensorboard.log_dir:
    return []
  run = run_dir(config)
  profile = tuple(config.tensorboard.profile_batches)
  chief = is_chief(config)
  if not (chief or config.tensorboard.profile_every_task):
    profile = ()
  throughput = Throughput(run if chief else os.path.join(run, task_name(config)),
                          "train" if chief else "", global_batch, profile=profile,
                          replicas=strategy.num_replicas_in_sync if chief else 0,
                          step_times=clock and step_times.StepTimes(
                              clock, strategy, task_name(config), chief,
                              data_workers=config.cluster.data_worker,
                              host=step_times.Host(os.cpu_count() or 1,
                                                   tasks_on_this_host(config))))
  if not chief:
    return [throughput]
  curves = ClusterTensorBoard(run, update_freq=config.tensorboard.update_freq,
                              first_step=first_epoch * (epoch_steps or 0), epoch_steps=epoch_steps)
  return [curves, throughput]


def scalars_sink(callbacks: list):
  """A function of (epoch, {tag: value}) adding scalars to the chief's throughput callback
  among `callbacks`, written at that epoch's end; None when there is none."""
  throughput = [c for c in callbacks if isinstance(c, Throughput) and c.replicas]
  return (lambda epoch, scalars: throughput[0].extra.update(scalars)) if throughput else None


class ClusterTensorBoard(keras.callbacks.TensorBoard):
  """Keras's TensorBoard callback whose batch steps are optimizer steps, continued after a
  resume (Keras counts calls of the compiled function, from 0 at every `fit`)."""

  def __init__(self, log_dir: str, *, update_freq: str, first_step: int,
               epoch_steps: int | None):
    super().__init__(log_dir=log_dir, update_freq=update_freq, write_graph=False)
    self._first_step, self._epoch_steps, self._epoch = first_step, epoch_steps, 0

  def on_train_begin(self, logs=None):
    super().on_train_begin(logs)
    self._global_train_batch = self._first_step

  def on_epoch_begin(self, epoch, logs=None):
    self._epoch = epoch
    super().on_epoch_begin(epoch, logs)

  def on_train_batch_end(self, batch, logs=None):
    if self._epoch_steps:  # `batch` is the call's last step: its scalars go at that step.
      self._global_train_batch = self._epoch * self._epoch_steps + batch + 1
    super().on_train_batch_end(batch, logs)


class Throughput(keras.callbacks.Callback):
  """This task's examples/s and steps/s per epoch, as `epoch_examples_per_second` and
  `epoch_steps_per_second`, and the profiler over `profile` = (first, last) batches. With
  `replicas`, also the achieved FLOP/s (`epoch_flops_per_second`: 6 x trainable parameters x
  examples/s, the dense-layer count of a forward and backward pass) and the model FLOP/s
  utilisation against `replicas` x this device's matmul peak (`epoch_mfu`; `machine.speed`:
  a large matmul measured once per machine).

  Args:
    directory: the run directory (the chief's) or the task's own directory.
    subdirectory: where under it the scalars go (`train` for the chief).
    global_batch: examples per step, for examples/s (None: steps/s alone).
    profile: (first, last) batches to profile, 1-based; empty for none.
    replicas: the replicas in sync, for FLOP/s and MFU; 0 writes neither.
    step_times: writes where this task's step time goes (and the straggler, on the chief).
  """

  def __init__(self, directory: str, subdirectory: str, global_batch: int | None,
               profile: tuple = (), replicas: int = 0,
               step_times: step_times.StepTimes | None = None):
    super().__init__()
    self.directory, self.global_batch, self.profile = directory, global_batch, profile
    self.step_times, self.extra = step_times, {}
    self.replicas, self._peak = replicas, None
    self._writer = tf.summary.create_file_writer(os.path.join(directory, subdirectory))
    self._steps, self._started, self._profiling = 0, 0.0, False

  def on_train_begin(self, logs=None):
    if self.replicas and self.global_batch:  # The chief's: it writes the MFU.
      peak = speed.matmul_peak(self.model.compute_dtype)
      self._peak = peak.flops
      print(f"tfdist: epoch_mfu in TensorBoard is against {self.replicas} replica(s) x "
            f"{peak.describe()}", flush=True)

  def on_epoch_begin(self, epoch, logs=None):
    self._steps, self._started = 0, time.perf_counter()
    if self.step_times:
      self.step_times.reset()  # Not the build's or the validation's time.

  def on_train_batch_begin(self, batch, logs=None):
    # A call runs steps batch+1 .. batch+steps_per_execution (1-based): profile the first call
    # reaching the first batch to profile.
    steps = getattr(self.model, "steps_per_execution", 1) or 1
    if self.profile and not self._profiling and batch + steps >= self.profile[0]:
      tf.profiler.experimental.start(self.directory)
      self._profiling = True

  def on_train_batch_end(self, batch, logs=None):
    self._steps = batch + 1
    if self._profiling and batch + 1 >= self.profile[1]:
      tf.profiler.experimental.stop()
      self._profiling, self.profile = False, ()

  def on_epoch_end(self, epoch, logs=None):
    seconds = max(time.perf_counter() - self._started, 1e-9)
    with self._writer.as_default():
      tf.summary.scalar("epoch_steps_per_second", self._steps / seconds, step=epoch)
      if self.global_batch:
        examples = self._steps * self.global_batch / seconds
        tf.summary.scalar("epoch_examples_per_second", examples, step=epoch)
        if self._peak:
          flops = 6 * sum(int(w.numpy().size) for w in self.model.trainable_weights) * examples
          tf.summary.scalar("epoch_flops_per_second", flops, step=epoch)
          if speed.raise_peak(self.model.compute_dtype, flops / self.replicas):
            self._peak = flops / self.replicas
            print(f"tfdist: each replica trained at {self._peak / 1e12:.3g} TFLOP/s, above the "
                  "measured matmul peak: epoch_mfu is against that from now on", flush=True)
          tf.summary.scalar("epoch_mfu", flops / (self.replicas * self._peak), step=epoch)
      if self.step_times:
        self.step_times.write(epoch)
      for tag, value in self.extra.items():  # Scalars the training loop measured.
        tf.summary.scalar(tag, value, step=epoch)
    self.extra = {}
    self._writer.flush()

  def on_train_end(self, logs=None):
    if self._profiling:
      tf.profiler.experimental.stop()
      self._profiling = False
    self._writer.close()
