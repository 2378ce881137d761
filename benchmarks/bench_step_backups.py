"""Step backups (`checkpoint.backup_every_steps`): what they cost a step, and what they save
after a kill -9.

Cost: `tfdist.fit` of the benchmarks' MLP (1.86 M parameters, Adam: a 22 MB backup) in one
process, epochs of 600 steps, backing up at epoch ends only (0) against every 100 steps within
the default budget (`checkpoint.backup_budget` 0.03: a due backup skipped while the last cost
over 3% of the time since it began) and every 100 steps whatever they cost (null),
interleaved, with the step backups each took; and plain Keras's own BackupAndRestore, which
writes in the step (`save_freq`), epoch-only against every 100 steps, for comparison.

Recovery (`benchmarks/recovery.py`): a local 2-worker launch whose worker-1 is killed -9
after step 5 of epoch 3: seconds from the kill to the chief's first step after the restart,
and the steps redone, with backups at epoch ends only and every 3 steps.

  python -m benchmarks.bench_step_backups [--rounds 3] [--recovery_rounds 2]
"""

import statistics
import tempfile

from absl import app, flags

from benchmarks import common, recovery

flags.DEFINE_integer("rounds", 3, "Fits of each cost contender; the median is shown.")
flags.DEFINE_integer("recovery_rounds", 2, "Launches of each recovery contender.")
FLAGS = flags.FLAGS

_STEPS, _BATCH, _EPOCHS = 600, 64, 3
_taken: list[int] = []  # Step backups taken by the last fit.


def _counting_backups() -> None:
  from tfdist.training import checkpoints
  save = checkpoints.Backup._save_model

  def counted(self, background=False):
    _taken[-1] += background  # The step backups (an epoch's end saves in the step).
    return save(self, background)
  checkpoints.Backup._save_model = counted


def _tfdist_fit(every: int, budget: float | None = 0.03) -> float:
  import tfdist
  x, y = common.data(_STEPS * _BATCH)
  timer = common.EpochTimer()
  _taken.append(0)
  with tempfile.TemporaryDirectory() as tmp:
    tfdist.fit(common.model_fn, x, y, compile=common.compile_args, epochs=_EPOCHS,
               callbacks=[timer], verbose=0, shuffle=False,
               config={"training": {"global_batch_size": _BATCH},
                       "checkpoint": {"dir": tmp, "backup_every_steps": every,
                                      "backup_budget": budget}})
  return len(x) / min(timer.seconds)


def _keras_fit(save_freq) -> float:
  import keras
  x, y = common.data(_STEPS * _BATCH)
  timer = common.EpochTimer()
  model = common.model_fn()
  model.compile(**common.compile_args())
  with tempfile.TemporaryDirectory() as tmp:
    backup = keras.callbacks.BackupAndRestore(tmp, save_freq=save_freq)
    model.fit(x, y, batch_size=_BATCH, epochs=_EPOCHS, callbacks=[backup, timer], verbose=0,
              shuffle=False)
  return len(x) / min(timer.seconds)


def main(argv):
  del argv
  _counting_backups()
  contenders = {
      "tfdist.fit, epoch backups only (0)": lambda: _tfdist_fit(0),
      "tfdist.fit, every 100 steps within 3% (default)": lambda: _tfdist_fit(100),
      "tfdist.fit, every 100 steps (budget null)": lambda: _tfdist_fit(100, None),
  }
  taken = {name: [] for name in contenders}

  def counting(name, run):
    def counted():
      figure = run()
      taken[name].append(_taken[-1])
      return figure
    return counted
  costs = common.interleave({name: counting(name, run) for name, run in contenders.items()},
                            FLAGS.rounds)
  print(common.table(costs, "tfdist.fit, epoch backups only (0)"))
  for name, counts in taken.items():
    print(f"{name}: step backups taken in {_EPOCHS} epochs of {_STEPS} steps: {counts}")
  keras_costs = common.interleave({
      "Keras BackupAndRestore, epoch": lambda: _keras_fit("epoch"),
      "Keras BackupAndRestore, every 100 steps": lambda: _keras_fit(100),
  }, FLAGS.rounds)
  print(common.table(keras_costs, "Keras BackupAndRestore, epoch"))
  print("| backups | seconds from kill -9 to training again | steps redone |\n|---|---|---|")
  for every in (0, 3):
    runs = [recovery.kill9(every) for _ in range(FLAGS.recovery_rounds)]
    print(f"| {'epoch ends' if every == 0 else f'every {every} steps'} | "
          f"{statistics.median(s for s, _ in runs):.1f} ({', '.join(f'{s:.1f}' for s, _ in runs)})"
          f" | {', '.join(str(r) for _, r in runs)} |")


if __name__ == "__main__":
  app.run(main)
