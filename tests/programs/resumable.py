"""Trains the equivalence model with Adam, shuffled, under the environment's config (which names
a checkpoint directory), printing `EPOCH_BEGIN e` / `EPOCH_END e` (0-based, flushed; EPOCH_END
comes after the backup is written) and finally `RESULT <json weights>`.

With PAUSE_AFTER_EPOCH=k, task worker-1 sleeps after finishing epoch k (1-based) so a test can
kill it there. With PAUSE_AT=e:s and GO_FILE=PATH, the first task prints `PAUSED` after step s
(1-based) of epoch e (0-based) and goes on once PATH exists (no pause when it already does), so
a test can send a preemption notice mid-epoch and let it go on once the notice is seen.
With CSV_LOG=PATH, a user's CSVLogger (Keras's default append=False) logs there; with
STEPS_PER_EXECUTION=n, n steps a call (1 by default); with STEP_LINES=1, the first task prints
`STEP e s` after each call (s: steps done in epoch e) and takes 0.2 s more. With HANG_AT=e:s and
HANG_MARKER=PATH, worker-1 of a first attempt (no PATH yet) blocks for good in a callback after
step s of epoch e (`block_forever`); HANG_IN=epoch_end blocks it in `on_epoch_end` of epoch e
instead, HANG_IN=input in its input (the data then come from `tf.data.Dataset.from_generator`,
unshuffled: `train_plain(generator=True)` is its reference) when it draws batch s of epoch e.
With SLOW_EPOCH_END=S the first task's first `on_epoch_end` takes S seconds. With
LATE_STACKS=S a task whose fit goes S seconds without a batch's or an epoch's end after its
first epoch, its end included, writes every thread's stack to its log (faulthandler), and a
fit still running S seconds after its last epoch's end writes its native stacks too (py-spy
dump --native, where py-spy is installed). A
sharded optimizer (training.zero_stage) prints `SHARDED <bytes>`, what
this task held beyond the weights (every variable of the process)."""

import json
import os
import signal
import time

import numpy as np

import tfdist
from tests.programs import equivalence_case as case

EPOCHS = 6
SEED = 7
_NATIVE_WAITER = []  # LATE_STACKS's py-spy waiter, armed at the last epoch's end.


def compile_args():
  import keras
  return dict(optimizer=keras.optimizers.Adam(0.01),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def train(config, callbacks=(), task="local"):
  x, y = case.data()
  per_call = {"steps_per_execution": int(os.environ.get("STEPS_PER_EXECUTION", "1"))}
  config = case.with_training(config, **{**case.BASE, **per_call}, seed=SEED)
  data = (generated(x, y, task),) if os.environ.get("HANG_IN") == "input" else (x, y)
  history = tfdist.fit(case.model_fn, *data, config=config, compile=compile_args,
                       batch_size=case.GLOBAL_BATCH, epochs=EPOCHS, callbacks=list(callbacks),
                       verbose=0)
  return history.model


def generated(x, y, task):
  """The batches of (x, y) in order, from a Python generator read by `from_generator` (each
  epoch calls it anew); worker-1's first attempt blocks in it at HANG_AT."""
  import tensorflow as tf
  epochs = iter(range(EPOCHS))

  def batches():
    epoch = next(epochs, EPOCHS)
    for step, first in enumerate(range(0, len(x), case.GLOBAL_BATCH)):
      if _hangs_here(task, epoch, step + 1):
        block_forever()
      yield x[first:first + case.GLOBAL_BATCH], y[first:first + case.GLOBAL_BATCH]
  return tf.data.Dataset.from_generator(batches, output_signature=(
      tf.TensorSpec([None, x.shape[1]], tf.float32), tf.TensorSpec([None], tf.int32)))


def train_plain(generator=False):
  """The same training by plain Keras's `model.fit` on one device, no tfdist: the reference
  (with `generator`, the generator's batches, the arrays in order: Keras's own fit of the
  `from_generator` dataset counts an update more each epoch, its data being of unknown length,
  0.02 apart after 6 epochs; tfdist's step loop does not, `keras_fixes`' `first_step`)."""
  model = case.model_fn()
  model.compile(**compile_args())
  if generator:
    case.fit_plain(model, *case.data(), EPOCHS)
  else:
    case.fit_plain(model, *case.data(), EPOCHS, SEED)
  return model


def _hangs_here(task, epoch, step) -> bool:
  """Whether this is where worker-1's first attempt blocks (HANG_AT=e:s; HANG_MARKER: the
  file it leaves, so the restarted run goes on)."""
  marker = os.environ.get("HANG_MARKER")
  if os.environ.get("HANG_AT") != f"{epoch}:{step}" or task != "worker-1" or not marker or \
      os.path.exists(marker):
    return False
  open(marker, "w").close()
  return True


def _native_stacks_later(seconds: float):
  """py-spy's native dump of this process, `seconds` from now, into this task's output; the
  started waiter (kill it when no longer wanted), or None without py-spy."""
  import shutil
  import subprocess
  if not shutil.which("py-spy"):
    return None
  return subprocess.Popen(["sh", "-c", f"sleep {seconds}; echo NATIVE_STACKS; "
                                       f"py-spy dump --native --pid {os.getpid()}"],
                          start_new_session=True)


def block_forever():
  """A deadlock in a user's callback: the process lives, its heartbeat beats."""
  import threading
  threading.Event().wait()


def _late_stacks(arm: bool = True) -> None:
  """(Re)arms LATE_STACKS's dump of every thread's stack, or cancels it."""
  import faulthandler
  if not os.environ.get("LATE_STACKS"):
    return
  if arm:
    faulthandler.dump_traceback_later(float(os.environ["LATE_STACKS"]), exit=False)
  else:
    faulthandler.cancel_dump_traceback_later()


class Progress:
  def __new__(cls, task):
    import keras
    pause = int(os.environ.get("PAUSE_AFTER_EPOCH", "0"))

    def end(epoch, logs):
      print(f"EPOCH_END {epoch}", flush=True)
      _late_stacks(arm=epoch > 0)  # Not over the first epoch's designed slow end.
      if epoch + 1 == EPOCHS and os.environ.get("LATE_STACKS"):
        _NATIVE_WAITER.append(_native_stacks_later(float(os.environ["LATE_STACKS"])))
      if os.environ.get("HANG_IN") == "epoch_end" and _hangs_here(task, epoch, 0):
        block_forever()
      if task in ("worker-0", "local") and epoch == 0:
        time.sleep(float(os.environ.get("SLOW_EPOCH_END", "0")))
      if task == "worker-1" and epoch + 1 == pause:
        time.sleep(600)
    paused_at = os.environ.get("PAUSE_AT")
    position = {"epoch": 0}

    def batch_end(batch, logs):
      _late_stacks(arm=position["epoch"] > 0)
      if os.environ.get("STEP_LINES") and task in ("worker-0", "local"):
        print(f"STEP {position['epoch']} {batch + 1}", flush=True)
        time.sleep(0.2)  # A call that takes time, as a real model's does.
      if os.environ.get("HANG_IN", "batch_end") == "batch_end" and \
          _hangs_here(task, position["epoch"], batch + 1):
        block_forever()
      go = os.environ.get("GO_FILE", "")
      if paused_at == f"{position['epoch']}:{batch + 1}" and task in ("worker-0", "local") \
          and not os.path.exists(go):
        print("PAUSED", flush=True)
        deadline = time.monotonic() + 300
        while not os.path.exists(go) and time.monotonic() < deadline:
          time.sleep(0.05)

    def begin(epoch, logs):
      position["epoch"] = epoch
      print(f"EPOCH_BEGIN {epoch}", flush=True)
    return keras.callbacks.LambdaCallback(on_epoch_begin=begin, on_epoch_end=end,
                                          on_train_batch_end=batch_end)


if __name__ == "__main__":
  print(f"PID {os.getpid()}", flush=True)
  config = tfdist.load_config()
  import keras
  csv = [keras.callbacks.CSVLogger(os.environ["CSV_LOG"])] if "CSV_LOG" in os.environ else []
  task = f"{config.task.type}-{config.task.index}" if config.task else "local"
  model = train(config, [Progress(task), *csv], task)
  _late_stacks(arm=False)
  for waiter in filter(None, _NATIVE_WAITER):
    if waiter.poll() is None:
      os.killpg(waiter.pid, signal.SIGKILL)
  if hasattr(model.optimizer, "tfdist_shards"):  # training.zero_stage
    from tfdist.testing import held_beyond_weights
    print(f"SHARDED {max(held_beyond_weights(model).values())}", flush=True)
  print("RESULT " + json.dumps([np.asarray(w).tolist() for w in model.get_weights()]),
        flush=True)
