"""Step backups within `checkpoint.backup_budget`: a backup due at a multiple of
`checkpoint.backup_every_steps` is skipped while the last cost more than the budget's share of
the time since it began, and every MultiWorkerMirrored worker takes the same ones."""

import json
import re
import time

import numpy as np
import pytest

from tests.launching import run_launch


class _Clock:
  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


def test_the_cadence_skips_a_due_backup_while_the_last_costs_over_its_share():
  """Hand-computed: a backup costing 0.3 s (0.1 s copy, 0.2 s write) under a 3% budget allows
  the next 10 s after it began; a write still going on allows none; null takes each multiple;
  the workers' vote is asked only at multiples."""
  from tfdist.training.backup_cadence import Cadence
  clock, asked = _Clock(), []
  cadence = Cadence(4, 0.03, clock=clock)
  assert not cadence.due(1, 3)  # No multiple of 4 crossed.
  assert cadence.due(3, 5)  # The first: nothing to afford yet.
  began = cadence.begin()
  clock.now += 0.1
  cadence.waited(began)
  assert cadence.cost() == float("inf")  # Still writing.
  clock.now += 5
  assert not cadence.due(7, 8)
  assert cadence.skip_line("epoch 1, step 8") == (
      "tfdist: step backups: the one due at epoch 1, step 8 is skipped: the last is still being "
      "written, over 3% of the 5.1 s since it began (checkpoint.backup_budget); the next is taken "
      "once affordable")
  cadence.wrote(0.2)
  assert cadence.cost() == pytest.approx(0.3)
  clock.now = began + 9.9
  assert not cadence.due(11, 12)
  assert cadence.skip_line("epoch 1, step 12") is None  # Said once.
  clock.now = began + 10.1
  assert cadence.due(15, 16)
  assert cadence.skipped == 2

  exact = Cadence(4, None, vote=lambda yes: asked.append(yes) or yes, clock=clock)
  exact.begin()  # Never finished: null takes every multiple all the same.
  assert [exact.due(s - 1, s) for s in range(1, 13)] == [s % 4 == 0 for s in range(1, 13)]
  voting = Cadence(4, 0.03, vote=lambda yes: asked.append(yes) or False, clock=clock)
  assert [voting.due(s - 1, s) for s in range(1, 5)] == [False] * 4
  assert voting.skip_line("epoch 1, step 4").startswith(
      "tfdist: step backups: the one due at epoch 1, step 4 is skipped: another worker's last "
      "cost more than 3% of the time")
  assert [voting.due(s - 1, s) for s in range(5, 9)] == [False] * 4
  assert asked == [True, True]  # Steps 4 and 8: this worker could, a peer could not.


def test_a_backup_due_is_skipped_while_the_last_costs_more_than_the_budget_allows(
    tmp_path, monkeypatch, capsys):
  """Writes of 0.2 s (a slow disk; on a clock of the test's own, which only the writes move,
  so a loaded machine's slow steps change nothing), backups due every 2 steps of 10-step
  epochs: under the 3% default the first is taken and the rest skipped (each would need 6.7 s
  since the last); with null, every multiple before an epoch's end (2, 4, 6, 8 of both
  epochs). Read from the files written: each weights file's optimizer step count."""
  import functools
  import types
  import h5py
  import keras
  import tfdist
  from tfdist.training import backup_cadence, checkpoints
  write, clock, taken = checkpoints.write_weights, [0.0], []

  def slow_write(copy, path):
    clock[0] += 0.2
    write(copy, path)
    with h5py.File(path) as written:  # Keras's weights file: the optimizer's `iterations`.
      taken.append(divmod(int(written["optimizer"]["vars"]["0"][()]), 10))
  monkeypatch.setattr(checkpoints, "write_weights", slow_write)
  monkeypatch.setattr(checkpoints, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
  monkeypatch.setattr(backup_cadence, "Cadence", functools.partial(
      backup_cadence.Cadence, clock=lambda: clock[0]))
  rng = np.random.default_rng(0)
  x, y = rng.random((320, 4), dtype=np.float32), rng.random((320, 1), dtype=np.float32)
  epoch_ends = [(1, 0), (2, 0)]  # Written too, whatever the budget.
  for budget, want in ((0.03, [(0, 2)]), (None, [(e, s) for e in (0, 1) for s in (2, 4, 6, 8)])):
    taken.clear()
    tfdist.fit(lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]), x, y,
               compile=lambda: dict(optimizer="sgd", loss="mse"), epochs=2, batch_size=32,
               shuffle=False, verbose=0,
               config={"training": {"steps_per_execution": 1},
                       "checkpoint": {"dir": str(tmp_path / str(budget)), "backup_every_steps": 2,
                                      "backup_budget": budget}})
    assert sorted(taken) == sorted(want + epoch_ends), budget
  said = re.findall(r"tfdist: step backups: .*", capsys.readouterr().out)
  assert len(said) == 1 and said[0].startswith(
      "tfdist: step backups: the one due at epoch 1, step 4 is skipped: the last "), said


def test_multi_worker_backups_are_taken_at_the_same_steps_only_when_every_worker_can_afford_them(
    tmp_path):
  """worker-1's writes take 0.3 s, worker-0's a few ms, a backup due at every step under a 50%
  budget: worker-0 alone would take most, but both take the same few (a sharded optimizer's
  backup is a collective: the workers must back up together)."""
  config = ("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n"
            "training: {steps_per_execution: 1}\n"
            f"checkpoint: {{dir: {tmp_path / 'checkpoints'}, backup_every_steps: 1, "
            "backup_budget: 0.5}\n")
  code, output = run_launch(tmp_path, config, "backup_vote.py",
                            env={"SLOW_WRITE_worker-1": "0.3"})
  assert code == 0, output[-3000:]
  taken = {task: json.loads(re.search(r"BACKUPS (.*)", (tmp_path / "logs" / f"{task}.log")
                                       .read_text())[1]) for task in ("worker-0", "worker-1")}
  assert taken["worker-0"] == taken["worker-1"], taken
  assert 1 <= len(taken["worker-0"]) < 3 * 19 // 2, taken  # The first, then few of the 57.
