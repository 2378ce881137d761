"""What `tfdist.fit` tells the user before training: what it chose that plain Keras would not,
where it resumes from, and a learning-rate schedule that ends before the run does.

Printed by the chief alone (every worker would print the same), as one line each:

```
tfdist: multi_worker_mirrored, 2 replicas, global batch 64 (32 per replica). Unlike plain Keras: bfloat16 mixed precision (auto: bfloat16 measured 1.83x float32 on Intel(R) Xeon(R) Platinum 8488C [avx512_bf16] (cached); training.mixed_precision: off for float32); 19 steps per call, batch callbacks once per call (training.steps_per_execution: 1); fused Adam update (training.fused_optimizer: false)
```
"""

from __future__ import annotations

import sys
from typing import TextIO

import keras

from tfdist.machine import precision as precision_lib


def choices_line(*, strategy_name: str, replicas: int, global_batch: int | None,
                 precision: "precision_lib.Precision", steps_per_execution: int,
                 fused: str | None, accumulation: int, sharded: str | None = None,
                 shuffled_arrays: bool = False, shuffled_batches: bool = False,
                 seed_note: str | None = None, data_workers: int = 0,
                 passes: str = "shared") -> str:
  """The start-of-fit line: the strategy, replicas and batch, then each choice tfdist made
  that plain Keras would not, with the config key that turns it off, and what `auto`
  measured. Pure."""
  batch = ("batch from the data" if global_batch is None else
           f"global batch {global_batch} ({global_batch // replicas} per replica)")
  head = f"tfdist: {strategy_name}, {replicas} replica{'s' * (replicas != 1)}, {batch}."
  unlike = []
  measured = precision.measured()
  if precision.policy != precision_lib.FLOAT32:
    why = f"auto: {measured}; " if measured else ""
    unlike.append(f"{precision.policy.removeprefix('mixed_')} mixed precision "
                  f"({why}training.mixed_precision: off for float32)")
  elif precision.fell_back:
    head += f" float32: the model did not build in {precision.measurement.half} (said above)."
  elif measured:  # auto measured half precision and kept float32: say so.
    head += (f" float32: {measured}, not faster (training.mixed_precision: "
             f"{precision.measurement.half} forces it).")
  if steps_per_execution > 1:
    unlike.append(f"{steps_per_execution} steps per call, batch callbacks once per call "
                  "(training.steps_per_execution: 1)")
  if fused:
    drift = ", not Keras's arithmetic" if fused.startswith("Adam") else ""
    unlike.append(f"fused {fused} update{drift} (training.fused_optimizer: false)")
  if accumulation > 1:
    unlike.append(f"one update every {accumulation} batches "
                  "(training.gradient_accumulation_steps: 1)")
  if sharded:
    unlike.append(sharded)
  if seed_note:
    head += f" Seeded by {seed_note}."
  if shuffled_arrays:
    unlike.append("arrays shuffled by (training.seed, epoch): one order on every worker and "
                  "replica count, not Keras's (shuffle=False: the arrays' own order)")
  if shuffled_batches:
    unlike.append("the PyDataset's batches shuffled by (training.seed, epoch): one order on "
                  "every worker, not Python's random (shuffle=False: its own order)")
  if data_workers:
    unlike.append(f"the dataset's pipeline run by {data_workers} tf.data service data "
                  f"worker{'s' * (data_workers != 1)}, each epoch "
                  f"{_PASSES[passes]}, its batches in the order they arrive (without "
                  "cluster.dispatcher and data_worker it runs here)")
  return head + (" Unlike plain Keras: " + "; ".join(unlike) if unlike else "")


_PASSES = {"shared": "one pass shared by every trainer",
           "per_trainer": "a whole pass for each trainer (data_service.passes: per_trainer)"}


def precision_line(precision: "precision_lib.Precision") -> str | None:
  """Said before the model is built: the precision tfdist chose for it (`auto`'s half type), or
  why the model was built in float32 after all; None where the config asked for the policy
  itself (off, bfloat16, float16) or `auto` kept float32. Pure."""
  if precision.fell_back:
    return (f"tfdist: the model did not build in {precision.measurement.half} mixed precision "
            f"({precision.fell_back}): built in float32 instead (training.mixed_precision: off "
            "says float32 at once; a layer computing its own float32 tensors needs its "
            "dtype_policy to train in the half type)")
  if precision.mode != "auto" or precision.policy == precision_lib.FLOAT32:
    return None
  return (f"tfdist: building the model in {precision.policy.removeprefix('mixed_')} mixed "
          f"precision (auto: {precision.measured()}; training.mixed_precision: off for float32)")


def resume_line(epoch: int, epochs: int, directory: str, step: int = 0) -> str:
  at = f"epoch {epoch + 1} of {epochs}" + (f", step {step + 1}" if step else "")
  return (f"tfdist: resuming at {at} from {directory} "
          "(`tfdist launch --fresh`, or TFDIST_FRESH=1, starts over)")


def schedule_end(schedule) -> int | None:
  """The optimizer step after which a decaying schedule stays at its final rate; None for
  schedules that never end (exponential, inverse time, restarts) or are not schedules."""
  inner = getattr(schedule, "base", None)  # tfdist's ScaledWarmup wraps the user's.
  if inner is not None and isinstance(inner, keras.optimizers.schedules.LearningRateSchedule):
    return schedule_end(inner)
  if isinstance(schedule, keras.optimizers.schedules.CosineDecay):
    return int(schedule.decay_steps) + int(schedule.warmup_steps or 0)
  if isinstance(schedule, keras.optimizers.schedules.PolynomialDecay) and not schedule.cycle:
    return int(schedule.decay_steps)
  return None


def schedule_warning(schedule, *, updates: int, epochs: int, updates_per_epoch: int) -> str | None:
  """A warning when `schedule` ends before the run's `updates` optimizer steps. Pure."""
  end = schedule_end(schedule)
  if end is None or end >= updates:
    return None
  return (f"tfdist: warning: the learning-rate schedule {type(schedule).__name__} ends at step "
          f"{end}, but this run makes {updates} optimizer steps ({epochs} epochs x "
          f"{updates_per_epoch}); the rate stays at its final value from epoch "
          f"{end // max(updates_per_epoch, 1) + 1}. Size decay_steps from the run's steps")


def say(line: str | None, out: TextIO | None = None) -> None:
  if line:
    print(line, file=out or sys.stdout, flush=True)
