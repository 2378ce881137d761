"""A multi-worker run survives a worker killed with SIGKILL: restarted, it resumes at the next
epoch with the optimizer's state and ends with an uninterrupted run's weights. Only the
chief's files remain in the checkpoint directory."""

import dataclasses
import json
import os
import pathlib
import sys
import time

import numpy as np
import pytest

import tfdist
from tfdist.testing.local_cluster import (kill, local_cluster, running, start_task, wait)
from tests.conftest import PROGRAMS, REPO
from tests.programs import resumable

KILLED_AFTER_EPOCH = 3

pytestmark = pytest.mark.usefixtures("two_cpus")  # TensorFlow starts with the suite's devices.


def _start_cluster(config_path, log_dir, env):
  """Every task of the config's cluster, or the one process of a config without one."""
  log_dir.mkdir()
  cluster = local_cluster(tfdist.load_config(config_path, environ={}).cluster)
  argv, env = [sys.executable, str(PROGRAMS / "resumable.py")], {"PYTHONPATH": str(REPO), **env}
  if not cluster.tasks():
    import subprocess
    from tfdist.testing.local_cluster import TaskProcess
    log = log_dir / "local.log"
    with open(log, "wb") as out:
      process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                 env={**os.environ, **env, "TFDIST_CONFIG": str(config_path)},
                                 start_new_session=True)
    return [TaskProcess(None, process, log)]
  return [start_task(task, argv, cluster, log_dir, config_path=config_path, env=env)
          for task in cluster.tasks()]


def _wait_for(process, text, timeout):
  deadline = time.monotonic() + timeout
  while text not in process.output():
    assert process.process.poll() is None, process.output()[-3000:]
    assert time.monotonic() < deadline, f"no {text!r} in {timeout} s:\n{process.output()[-3000:]}"
    time.sleep(0.2)


def _rows(env) -> list[str]:
  path = env["CSV_LOG"]
  return open(path).read().splitlines() if os.path.exists(path) else []


def _lines(process, prefix):
  return [line[len(prefix):] for line in process.output().splitlines() if line.startswith(prefix)]


@pytest.fixture(scope="module")
def uninterrupted_weights():
  """Plain Keras's weights for the same training on one device, uninterrupted."""
  return [np.asarray(w) for w in resumable.train_plain().get_weights()]


# (training lines, checkpoint keys beside dir, where the first attempt is killed, (epoch, step)
# the restart resumes at).
_KILLS = {
    # At an epoch's end: the epoch's backup (8 steps an epoch, fewer than the default interval).
    "whole": ("", "", {"PAUSE_AFTER_EPOCH": str(KILLED_AFTER_EPOCH)}, (KILLED_AFTER_EPOCH, 0)),
    # Mid-epoch, sharded (issue 34: each backup holds the whole optimizer, gathered from the
    # shards): the step backup of step 3 (every 3 steps, issue 59), killed after step 5.
    "sharded": ("training: {zero_stage: 1}\n",
                ", backup_every_steps: 3, backup_budget: null",
                {"PAUSE_AT": "2:5"}, (2, 3)),
}


@pytest.mark.parametrize("kill_at", list(_KILLS))
def test_a_cluster_killed_9_resumes_at_its_newest_backup_with_uninterrupted_weights(
    tmp_path, uninterrupted_weights, kill_at):
  """Every task killed -9 (a power loss): the restart resumes at the newest backup, an epoch's
  or (mid-epoch) a step backup, redoing at most `backup_every_steps` steps, and ends with
  plain Keras's uninterrupted weights."""
  training_lines, every, pause, (epoch, step) = _KILLS[kill_at]
  training = bool(training_lines)
  checkpoints = tmp_path / "checkpoints"
  config = tmp_path / "mwms.yaml"
  config.write_text("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n"
                    f"checkpoint: {{dir: {checkpoints}{every}}}\n{training_lines}")
  tmp = tmp_path / "tmp"
  tmp.mkdir()
  env = {"TMPDIR": str(tmp), "CSV_LOG": str(tmp_path / "log.csv")}
  with running(_start_cluster(config, tmp_path / "first", {**env, **pause})) as first:
    if "PAUSE_AT" in pause:
      _wait_for(first[0], "PAUSED", 180)  # Worker-0 after step 5; worker-1 waits in step 6.
    else:
      _wait_for(first[1], f"EPOCH_END {KILLED_AFTER_EPOCH - 1}", 180)
      # And the chief's CSVLogger past that epoch's row: killed before it (its `on_epoch_end`
      # runs after the backup is written), the restart resumes after the epoch and the row is
      # never written (seen once on a loaded machine).
      deadline = time.monotonic() + 60
      while not any(row.startswith(f"{KILLED_AFTER_EPOCH - 1},") for row in _rows(env)):
        assert time.monotonic() < deadline, _rows(env)
        time.sleep(0.05)
    kill([first[1]])  # SIGKILL, as a dead machine would.
    kill([first[0]])  # Its peer would fail or wait; the cluster restarts as a whole.
  assert (checkpoints / "backup" / "worker-1" / "latest.weights.h5").is_file()

  with running(_start_cluster(config, tmp_path / "second", env)) as second:
    wait(second, 180)
  resumed = f"resuming at epoch {epoch + 1} of {resumable.EPOCHS}" + (
      f", step {step + 1} " if step else " ")
  assert resumed in second[0].output(), second[0].output()[-3000:]  # The chief says it.
  for p in second:
    assert p.process.returncode == 0, p.output()[-3000:]
    assert _lines(p, "EPOCH_BEGIN ")[0] == str(epoch)  # 0-based.
    weights = json.loads(_lines(p, "RESULT ")[0])
    for got, want in zip(weights, uninterrupted_weights, strict=True):
      np.testing.assert_allclose(got, want, atol=1e-5)
    if training:  # Adam's two moments of half the weights (each shard a ring chunk, padded to
      whole = sum(np.asarray(w).size for w in weights) * 4  # 64 bytes), counters, metrics.
      assert 2 * whole / 2 <= int(_lines(p, "SHARDED ")[0]) <= 2 * whole / 2 + 2 * 64 + 256
  if training:  # The checkpoint holds the whole optimizer, as an unsharded run's would.
    import h5py
    with h5py.File(checkpoints / "epoch-0006.weights.h5") as saved:
      shapes = [saved["optimizer"]["vars"][str(i)].shape
                for i in range(len(saved["optimizer"]["vars"]))]
    assert shapes == [(), ()] + [np.shape(w) for w in weights for _ in range(2)], shapes

  # The user's CSVLogger appended after the restart: every epoch once, the first run's kept.
  rows = (tmp_path / "log.csv").read_text().splitlines()
  assert [row.split(",")[0] for row in rows] == ["epoch", *map(str, range(resumable.EPOCHS))]
  # Only the chief's files: its checkpoints and final model; no backups, no worker files.
  names = sorted(os.listdir(checkpoints))
  assert names == [f"epoch-{e:04d}.weights.h5" for e in range(4, 7)] + ["model.keras"], names
  assert [n for n in os.listdir(tmp) if n.startswith("tfdist-")] == []  # Workers' scratch.


def test_a_sigterm_mid_epoch_saves_the_backup_there_and_the_restart_resumes_there(
    tmp_path, uninterrupted_weights):
  """SIGTERM to a one-process run in epoch 3: it saves its backup after the step and exits
  with 42; relaunched, it resumes at the next step and ends with an uninterrupted run's
  weights."""
  import signal
  checkpoints = tmp_path / "checkpoints"
  config = tmp_path / "config.yaml"
  # One process (mirrored over 2 logical CPUs); several workers: test_preemption.py.
  config.write_text("strategy: mirrored\ndevices: {logical_cpus: 2}\n"
                    f"checkpoint: {{dir: {checkpoints}}}\n")
  tmp = tmp_path / "tmp"
  tmp.mkdir()
  go = tmp_path / "go"
  with running(_start_cluster(config, tmp_path / "first", {
      "TMPDIR": str(tmp), "PAUSE_AT": "2:3", "GO_FILE": str(go)})) as first:
    _wait_for(first[0], "PAUSED", 180)
    first[0].process.send_signal(signal.SIGTERM)
    _wait_for(first[0], "tfdist: SIGTERM received", 60)
    go.touch()
    wait(first, 60)
  (only,) = first
  assert only.process.returncode == 42, only.output()[-3000:]
  saved = [line.split(";")[0] for line in _lines(only, "tfdist: preempted: backup saved at ")]
  # The step after the paused one: tfdist asks before the user's callback paused.
  assert saved == ["epoch 3, step 4"], only.output()[-3000:]

  with running(_start_cluster(config, tmp_path / "second", {"TMPDIR": str(tmp)})) as second:
    wait(second, 180)
  for p in second:
    assert p.process.returncode == 0, p.output()[-3000:]
    assert _lines(p, "EPOCH_BEGIN ")[0] == "2"
    weights = json.loads(_lines(p, "RESULT ")[0])
    for got, want in zip(weights, uninterrupted_weights, strict=True):
      np.testing.assert_allclose(got, want, atol=1e-5)
  chief = second[0].output()
  assert "tfdist: resuming at epoch 3 of 6, step 5 from" in chief, chief[-3000:]


def test_a_backup_save_that_fails_half_way_leaves_the_previous_backup_whole(tmp_path):
  """A chief whose parameter server dies while it saves raises half-way through the weights;
  the backup it had stays loadable and names its own position (Keras writes in place and falls
  back only on an OSError: a half-written .h5 raises ValueError, keras-team/keras#20463)."""
  import keras
  from tfdist.training import checkpoints
  config = tfdist.load_config({"checkpoint": {"dir": str(tmp_path)}}, environ={})
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  model.compile("sgd", "mse")
  backup = checkpoints.Backup(config)
  backup.set_model(model)
  backup.save_position(1, 5)
  saved = [w.copy() for w in model.get_weights()]

  def dies_half_way(store):
    store["0"] = np.zeros((3, 2))  # Half the layer's variables read, then the link is gone.
    raise RuntimeError("recvmsg:Connection reset by peer")
  model.set_weights([w + 1 for w in saved])
  model.layers[0].save_own_variables = dies_half_way
  with pytest.raises(RuntimeError):
    backup.save_position(2, 0)
  # A write that fails (a full disk) in the background: raised at the next wait, nothing moved.
  del model.layers[0].save_own_variables
  write = checkpoints.write_weights

  def disk_full(copy, path):
    write(copy, path)
    with open(path, "r+b") as f:
      f.truncate(100)  # Half-written, then the disk is full.
    raise OSError(28, "No space left on device")
  checkpoints.write_weights = disk_full
  try:
    backup._save_model(background=True)
    with pytest.raises(OSError, match="No space left"):
      backup.wait()
  finally:
    checkpoints.write_weights = write

  restored = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  restored.compile("sgd", "mse")
  again = checkpoints.Backup(config)
  again.set_model(restored)
  assert again.saved_position() == (1, 5)
  again.on_train_begin()
  for got, want in zip(restored.get_weights(), saved, strict=True):
    np.testing.assert_array_equal(got, want)


def test_a_step_backup_is_written_in_the_background_and_loads_as_keras_saved_it(tmp_path):
  """Every `backup_every_steps` steps, every variable is copied at that step and written by
  another thread while the next steps run (the write held here until step 5 ends); Keras's own
  `load_weights` reads it as `save_weights` wrote it, and it names its epoch and step."""
  import threading
  import keras
  from tfdist.training import checkpoints
  config = tfdist.load_config({"checkpoint": {"dir": str(tmp_path), "backup_every_steps": 2,
                                              "backup_budget": None}},
                              environ={})
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  model.compile(keras.optimizers.Adam(0.1), "mse")
  model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)  # Adam's moments, not zeros.
  backup = checkpoints.Backup(config)
  backup.set_model(model)
  backup.within_epochs(8, first_step=1)  # Resumed after step 1 of its epoch.
  released, written = threading.Event(), []
  write = backup._write
  backup._write = lambda copy, position: (
      released.wait(30), write(copy, position),
      written.append((position, pathlib.Path(backup._weights_path).read_bytes())))
  backup.on_epoch_begin(4)
  backup.on_train_batch_end(0)  # Step 2 of the epoch: a backup begins.
  at_step_2 = [w.copy() for w in model.get_weights()]
  model.set_weights([w + 1 for w in at_step_2])  # Steps 3 to 5 go on meanwhile.
  for batch in (1, 2, 3):
    backup.on_train_batch_end(batch)  # Step 4 waits for step 2's backup...
    if batch == 1:
      assert written == [], "a step waited for its backup's write"
      released.set()
  backup.wait()
  assert [position for position, _ in written] == [{"epoch": 4, "batch": 2},
                                                   {"epoch": 4, "batch": 4}]
  (tmp_path / "step-2.weights.h5").write_bytes(written[0][1])
  step_2 = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  step_2.load_weights(tmp_path / "step-2.weights.h5")  # Step 2's weights, written after.
  for got, want in zip(step_2.get_weights(), at_step_2, strict=True):
    np.testing.assert_array_equal(got, want)

  plain = tmp_path / "plain.weights.h5"
  model.save_weights(plain)  # Keras's own file of the same state (step 4's).
  for path in (plain, backup._weights_path):
    restored = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    restored.compile(keras.optimizers.Adam(0.1), "mse")
    restored.optimizer.build(restored.trainable_variables)
    restored.load_weights(path)
    for got, want in zip(restored.get_weights() + [v.numpy() for v in
                                                   restored.optimizer.variables],
                         model.get_weights() + [v.numpy() for v in model.optimizer.variables],
                         strict=True):
      np.testing.assert_array_equal(got, want)
  assert checkpoints.Backup(config).saved_position() == (4, 4)


def test_keras_alone_loses_its_backup_to_a_save_that_fails_half_way(tmp_path):
  """Detector of keras-team/keras#20463 (its fix, #20465, falls back only on an OSError): fails
  once Keras's own BackupAndRestore survives the half-written file; then delete
  `checkpoints.Backup._save_model`."""
  import h5py
  import keras
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  model.compile("sgd", "mse")
  backup = keras.callbacks.BackupAndRestore(str(tmp_path), double_checkpoint=True)
  backup.set_model(model)
  backup._save_model()

  def dies_half_way(filepath, overwrite=True):
    h5py.File(filepath, "w").close()
    raise RuntimeError("recvmsg:Connection reset by peer")
  model.save_weights = dies_half_way
  with pytest.raises(RuntimeError):
    backup._save_model()
  restored = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  restored.compile("sgd", "mse")
  again = keras.callbacks.BackupAndRestore(str(tmp_path), double_checkpoint=True)
  again.set_model(restored)
  with pytest.raises(ValueError, match="could not be loaded"):
    again.on_train_begin()


def test_a_worker_back_resumes_from_the_clusters_newest_backup_not_its_own_older_one(tmp_path):
  """A worker that left an elastic cluster comes back with its own backup of when it left;
  the others saved later: it resumes where they are (synchronous replicas hold one state)."""
  import keras
  from tfdist.config.schema import TaskConfig
  from tfdist.training import checkpoints

  def backup_of(index, weights, epoch, step):
    config = tfdist.load_config({"cluster": {"worker": 3}, "checkpoint": {"dir": str(tmp_path)}},
                                environ={})
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    if weights is not None:
      model.set_weights(weights)
    backup = checkpoints.Backup(dataclasses.replace(config, task=TaskConfig("worker", index)))
    backup.set_model(model)
    if epoch is not None:
      backup.save_position(epoch, step)
    return backup, model
  old = [np.zeros((3, 2), "float32"), np.zeros(2, "float32")]
  new = [np.ones((3, 2), "float32"), np.ones(2, "float32")]
  backup_of(2, old, 2, 1)  # worker-2 left at epoch 2, step 1.
  backup_of(0, new, 3, 2)  # The others went on to epoch 3, step 2.
  backup_of(1, new, 3, 2)
  back, model = backup_of(2, None, None, None)
  assert back.saved_position() == (3, 2)
  back.on_train_begin()
  for got, want in zip(model.get_weights(), new, strict=True):
    np.testing.assert_array_equal(got, want)
  ahead, _ = backup_of(0, None, None, None)  # Its own is the newest: kept.
  assert ahead.saved_position() == (3, 2)


def test_the_backups_and_the_preemption_save_count_a_resumed_epochs_steps_once(tmp_path):
  """One count of where training stands (`Backup.position`): resumed 4 steps into epoch 2 of
  10-step epochs, this fit's epoch is 6 calls; call 2 ends at step 7, the last call at the next
  epoch's start, and the epoch after counts from 0. A preemption notice in the resumed epoch
  saves at that same step (hand computations)."""
  import keras
  from tfdist.training import checkpoints, preemption
  config = tfdist.load_config({"checkpoint": {"dir": str(tmp_path)}}, environ={})
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  model.compile("sgd", "mse")
  backup = checkpoints.Backup(config)
  backup.set_model(model)
  backup.within_epochs(10, first_step=4)
  backup.on_epoch_begin(2)
  assert backup.position(2, steps=6) == (2, 7)
  assert backup.position(5, steps=6) == (3, 0)

  class Noticed:
    def stop_now(self):
      return True

    def exit_preempted(self, where, say):
      saved.append(where)

  saved = []
  save_position = backup.save_position
  backup.save_position = lambda epoch, step: saved.append((epoch, step))
  callback = preemption.Preemption(backup, Noticed())
  callback.set_params({"steps": 6})
  callback.on_train_batch_end(2)
  assert saved == [(2, 7), "epoch 3, step 7"]
  backup.save_position = save_position
  backup.on_epoch_end(2)
  backup.on_epoch_begin(3)
  assert backup.position(2, steps=10) == (3, 3)
