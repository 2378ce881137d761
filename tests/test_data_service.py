"""The tf.data service's roles in a launch (`cluster.dispatcher`, `cluster.data_worker`): the
config refuses a half service in one line, the plan runs each role with `tfdist data-service`
and keeps them out of TF_CONFIG, and a launched script reading through the service (TensorFlow's
own `distribute`) sees every element once per epoch; a data worker killed -9 mid-epoch is
restarted alone at its address, and that epoch loses at most its in-flight split, never a
duplicate, the next whole."""

import json
import re
import signal
import os

import pytest

import tfdist
from tests.launching import finish, read_until, start_launch


@pytest.mark.parametrize("cluster,message", [
    ({"worker": 1, "dispatcher": 1}, "cluster.dispatcher: the tf.data service needs a "
                                      "dispatcher and data workers: give cluster.data_worker too"),
    ({"worker": 1, "data_worker": 2}, "cluster.data_worker: the tf.data service needs a "
                                       "dispatcher and data workers: give cluster.dispatcher too"),
    ({"dispatcher": 1, "data_worker": 1}, "cluster.dispatcher: the tf.data service feeds "
                                          "trainers: give the cluster a chief or workers"),
    ({"worker": 1, "dispatcher": 2, "data_worker": 1}, "a cluster has at most one dispatcher"),
])
def test_a_half_service_is_refused_in_one_line(cluster, message):
  with pytest.raises(tfdist.ConfigError, match=re.escape(message)):
    tfdist.load_config({"cluster": cluster})


def test_the_plan_runs_each_role_and_keeps_them_out_of_tf_config(tmp_path):
  """TensorFlow's strategies and a script's own `MultiWorkerMirroredStrategy()` read TF_CONFIG:
  it names the trainers only; every task gets the service's addresses beside it, and a
  launched task's config has them (what `tfdist.data_service_address` reads)."""
  from tfdist.launch import plan
  from tfdist.config.loader import DATA_SERVICE_ENV
  config = tfdist.load_config({"cluster": {"worker": 2, "dispatcher": 1, "data_worker": 2},
                               "strategy": "multi_worker_mirrored"})
  planned = plan.plan_launch(config, str(tmp_path / "c.yaml"), ["python", "train.py"],
                             log_dir=str(tmp_path), ports=range(3000, 3005))
  argv = {p.name: p.argv for p in planned.processes}
  assert argv["dispatcher-0"][-4:] == ("data-service", str(tmp_path / "c.yaml"), "--task",
                                       "dispatcher:0")
  assert argv["data_worker-1"][-1] == "data_worker:1" and argv["worker-1"] == ("python",
                                                                               "train.py")
  for p in planned.processes:
    env = dict(p.env)
    assert json.loads(env["TF_CONFIG"])["cluster"] == {
        "worker": ["127.0.0.1:3000", "127.0.0.1:3001"]}, p.name
    assert json.loads(env[DATA_SERVICE_ENV]) == {
        "dispatcher": ["127.0.0.1:3002"], "data_worker": ["127.0.0.1:3003", "127.0.0.1:3004"]}
    assert p.serves == (p.task.type != "worker")
  worker = dict(planned.processes[-1].env)
  launched = tfdist.load_config({"cluster": {"worker": 2, "dispatcher": 1, "data_worker": 2}},
                               environ=worker)
  assert tfdist.data_service_address(launched) == "grpc://127.0.0.1:3002"
  assert launched.task == tfdist.config.TaskConfig("worker", 1)


def test_a_data_worker_killed_mid_epoch_is_restarted_alone_and_no_element_is_seen_twice(
    tmp_path):
  (tmp_path / "config.yaml").write_text("cluster: {worker: 1, dispatcher: 1, data_worker: 2}\n")
  launcher = start_launch(str(tmp_path / "config.yaml"), "--logs", str(tmp_path / "logs"),
                          "--grace-period", "3", "--", "python",  # The default restarts.
                          "tests/programs/data_service_reader.py")
  seen = []
  try:
    read_until(launcher, r"\[worker-0\] MIDWAY", 240, seen)
    killed = int(re.search(r"data_worker-0 started \(pid (\d+)\)", "".join(seen))[1])
    os.kill(killed, signal.SIGKILL)
    output = finish(launcher, 240, seen)
  finally:
    if launcher.poll() is None:
      os.killpg(launcher.pid, signal.SIGKILL)
  assert launcher.returncode == 0, output[-4000:]
  assert "restarting data_worker-0 alone (its own restart 1 of 3: a data_worker holds no " \
      "training state; --max-restarts untouched)" in output, output[-4000:]
  assert "data_worker-0 is up again at 127.0.0.1:" in output, output[-4000:]
  epochs = [json.loads(counts) for counts in re.findall(r"\[worker-0\] EPOCH \d (.*)", output)]
  assert len(epochs) == 3, output[-4000:]
  for epoch in (0, 2):
    assert sorted(map(int, epochs[epoch])) == list(range(400)), epoch
    assert set(epochs[epoch].values()) == {1}, epoch
  assert set(epochs[1].values()) == {1} and 390 <= len(epochs[1]) <= 400, len(epochs[1])


def test_a_tfjob_which_has_no_place_for_the_roles_refuses_them_in_one_line(tmp_path):
  import subprocess
  import sys
  from tests.launching import ENV
  config = tmp_path / "config.yaml"
  config.write_text("cluster: {worker: 1, dispatcher: 1, data_worker: 1}\n")
  done = subprocess.run([sys.executable, "-m", "tfdist", "export", "kubernetes", str(config),
                         "--kind", "tfjob", "--image", "i", "--", "python", "train.py"],
                        env=ENV, capture_output=True, text=True, timeout=120)
  lines = done.stderr.strip().splitlines()
  assert done.returncode == 2 and len(lines) == 1, done.stderr
  assert "cluster.dispatcher: the tf.data service's roles are launched by tfdist launch " \
      "(every backend, and per host with --task) and by tfdist export kubernetes's JobSet and " \
      "StatefulSets; a TFJob (--kind tfjob) has no place for them. Received: 1" in lines[0], \
      lines[0]


def _trained(tmp_path, config_text: str, env=None) -> str:
  """The output of a whole launch of tests/programs/data_service_fit.py that ended with 0."""
  (tmp_path / "config.yaml").write_text(config_text)
  launcher = start_launch(str(tmp_path / "config.yaml"), "--logs", str(tmp_path / "logs"),
                          "--", "python", "tests/programs/data_service_fit.py", env=env or {})
  try:
    output = finish(launcher, 240, [])
  finally:
    if launcher.poll() is None:
      os.killpg(launcher.pid, signal.SIGKILL)
  assert launcher.returncode == 0, output[-4000:]
  return output


_SERVED = ("cluster: {worker: 2, dispatcher: 1, data_worker: 2}\n"
           "strategy: multi_worker_mirrored\ntraining: {global_batch_size: 16}\n")


@pytest.mark.parametrize("loop", [False, True], ids=["fit", "training_loop"])
def test_fit_on_two_workers_reads_each_example_once_an_epoch_through_two_data_workers(
    tmp_path, loop):
  """One device reads each of the 192 examples once an epoch (a hand count); two trainers
  reading one pass of the service's each epoch, unequal shares, do too: Keras Metric
  subclasses count each example id over both workers. fit's model has its own train_step (as
  Keras's guide writes one) and the config no global batch: the dataset's is taken.
  tfdist.fit's TensorBoard (the loop writes none) records the data workers beside each epoch's
  split, runs compared by it. The loop reads a pass per trainer (`data_service.passes:
  per_trainer`): each example twice an epoch, once by each trainer (a hand count)."""
  tensorboard = "" if loop else f"tensorboard: {{log_dir: {tmp_path / 'tb'}}}\n"
  if loop:
    output = _trained(tmp_path, _SERVED + "data_service: {passes: per_trainer}\n",
                      env={"LOOP": "1"})
  else:  # A model's own train_step, the global batch the dataset's (the config gives none).
    config = _SERVED.replace("training: {global_batch_size: 16}\n", "")
    output = _trained(tmp_path, config + tensorboard, env={"OWN_STEP": "1"})
    assert "global batch 16 (8 per replica)" in output, output[-3000:]
  epochs = json.loads(re.search(r"\[worker-0\] EPOCHS (.*)", output)[1])
  assert epochs == ([[0, 192, 192]] if loop else [[192, 0, 192]]) * 3, epochs
  assert "the dataset's pipeline run by 2 tf.data service data workers, each epoch " + (
      "a whole pass for each trainer (data_service.passes: per_trainer)" if loop else
      "one pass shared by every trainer") in output, output[-3000:]
  assert "ran out of data" not in output, output[-3000:]
  if not loop:  # Keras's bar counts each epoch's own steps (they differ: pieces arrive apart).
    bars = re.findall(r"\[worker-0\] (\d+)/(\d+) - ", output)
    steps = re.findall(r"\[worker-0\] STEPS (\d+)", output)
    assert len(steps) == 3 and bars == [(n, n) for n in steps], (bars, steps)
    from tests.test_monitoring import scalars
    train, _ = scalars(tmp_path / "tb" / "logs" / "train")
    assert {value for _, value in train["data_workers"]} == {2.0}, train
    assert len(train["epoch_input_share"]) == 3, train


def _fit_with_a_role_killed_midway(tmp_path, role: str, extra: str = "") -> tuple[int, str]:
  """(exit code, output) of a launch of data_service_fit.py under the default flags whose
  `role` task ("data_worker-0", "dispatcher-0") is killed -9 in epoch 1, while the chief
  pauses there (MIDWAY): restarted alone from its role's own restarts."""
  (tmp_path / "config.yaml").write_text(  # A call a step: the pause falls within the epoch.
      _SERVED.replace("global_batch_size: 16", "global_batch_size: 16, steps_per_execution: 1")
      + extra)
  launcher = start_launch(str(tmp_path / "config.yaml"), "--logs", str(tmp_path / "logs"),
                          "--", "python", "tests/programs/data_service_fit.py",
                          env={"MIDWAY": "1"})  # The default flags: --max-restarts 0.
  seen = []
  try:
    read_until(launcher, r"\[worker-0\] MIDWAY", 240, seen)
    os.kill(int(re.search(rf"{role} started \(pid (\d+)\)", "".join(seen))[1]), signal.SIGKILL)
    output = finish(launcher, 240, seen)
  finally:
    if launcher.poll() is None:
      os.killpg(launcher.pid, signal.SIGKILL)
  kind = role.split("-")[0]
  assert f"restarting {role} alone (its own restart 1 of 3: a {kind} holds no training " \
         "state; --max-restarts untouched)" in output, output[-4000:]
  return launcher.returncode, output


def _epochs_around_whole_and_none_twice(output: str) -> None:
  epochs = json.loads(re.search(r"\[worker-0\] EPOCHS (.*)", output)[1])
  assert epochs[0] == epochs[2] == [192, 0, 192], epochs
  once, again, trained = epochs[1]
  # What a killed data worker held, at most 3 batches of 16 (TensorFlow's
  # FirstComeFirstServedTaskRunner): the one in its buffer of one, the one its prefetch thread
  # made and waits to put there, the one it is building. Measured 0, 4 and 15 in three runs.
  assert again == 0 and once == trained and 192 - 3 * 16 <= trained <= 192, epochs


def test_fit_goes_on_when_a_data_worker_is_killed_mid_epoch_and_trains_on_no_example_twice(
    tmp_path):
  """A data worker killed -9 in epoch 1 (of 0-2) of tfdist.fit over two trainers: the launcher
  restarts it alone, training goes on; that epoch loses what the worker held (its in-flight
  split and the pieces it had made), never an example twice; the epochs around it whole."""
  code, output = _fit_with_a_role_killed_midway(tmp_path, "data_worker-0")
  assert code == 0, output[-4000:]
  _epochs_around_whole_and_none_twice(output)


@pytest.mark.parametrize("strategy,data,message", [
    ("multi_worker_mirrored", "arrays", "train_data: the tf.data service (cluster.dispatcher) "
     "runs a tf.data.Dataset's pipeline on its data workers: pass one, batched by the global "
     "batch, or leave the dispatcher and data workers out. Received: tuple"),
    ("split", "dataset", "cluster.dispatcher: is not honoured by a split model: a split "
     "model's workers take their slices of each batch themselves"),
    ("multi_worker_mirrored", "generator", "train_data: the tf.data service's data workers run "
     "the dataset from its graph, and this one runs Python code (from_generator or "
     "py_function): build it from arrays or files, or leave the service out."),
    # Before, accepted in silence: 129 of 256 examples trained an epoch.
    ("multi_worker_mirrored", "shard", "train_data: the tf.data service's data workers cannot "
     "run .shard(): the service splits each pass over its data workers itself"),
])
def test_what_the_service_cannot_read_is_refused_before_anything_starts(strategy, data, message):
  import numpy as np
  import tensorflow as tf
  cluster = {"worker": 1, "dispatcher": 1, "data_worker": 1}
  config = {"cluster": cluster, "strategy": strategy}
  if strategy == "split":  # A split model across the workers (`parallel:`).
    config.update(strategy="multi_worker_mirrored", parallel={"stages": "balanced"})
  x, y = np.zeros((8, 2), "float32"), np.zeros(8, "float32")
  train = (x, y) if data == "arrays" else tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
  if data == "generator":
    train = tf.data.Dataset.from_generator(lambda: iter([(x, y)]), output_signature=(
        tf.TensorSpec((None, 2)), tf.TensorSpec((None,))))
  if data == "shard":
    train = tf.data.Dataset.from_tensor_slices((x, y)).shard(2, 0).batch(4)
  with pytest.raises(tfdist.TfdistError) as raised:
    tfdist.fit(lambda: None, train, config=config)
  assert message in str(raised.value) and "\n" not in str(raised.value), raised.value


@pytest.mark.parametrize("where", ["pipeline", "interleaved"])
def test_a_shard_anywhere_in_the_pipeline_is_named_even_inside_a_function(where):
  """`.shard()` at the pipeline's top level or inside an interleave's function (the graph's
  function library): every op of the dataset's graph is read."""
  import tensorflow as tf
  from tfdist.training import data
  files = tf.data.Dataset.range(4)
  dataset = (files.shard(2, 0).batch(2) if where == "pipeline" else
             files.interleave(lambda i: tf.data.Dataset.range(i).shard(2, 0)).batch(2))
  with pytest.raises(data.DataError, match=r"^dataset: the tf.data service's data workers "
                                           r"cannot run \.shard\(\).*Received: a dataset with "
                                           r"ShardDataset$"):
    data.require_servable(dataset, "dataset")
  data.require_servable(files.batch(2), "dataset")  # Nothing to refuse.


def test_per_host_roles_train_through_the_service_and_end_by_themselves(write_config,
                                                                          tmp_path):
  """One `tfdist launch --task` per role, as on real hosts (all on 127.0.0.1): the trainers
  read each example once an epoch through the dispatcher and data worker launched beside them,
  and those end by themselves once the chief is gone (a host's launch then ends)."""
  import sys
  from tfdist.machine.ports import HeldPorts
  held = HeldPorts(4)  # Bound, never listening, until the test ends: no other test takes them.
  w0, w1, dispatcher, data_worker = (f"127.0.0.1:{p}" for p in held.ports)
  path = write_config(
      f'cluster: {{worker: ["{w0}", "{w1}"], dispatcher: ["{dispatcher}"], '
      f'data_worker: ["{data_worker}"]}}\n'
      "strategy: multi_worker_mirrored\ntraining: {global_batch_size: 16}\n")
  tasks = ("dispatcher:0", "data_worker:0", "worker:1", "worker:0")
  launchers = {task: start_launch(str(path), "--task", task, "--logs", str(tmp_path / task),
                                  "--", sys.executable, "tests/programs/data_service_fit.py")
               for task in tasks}
  try:
    outputs = {task: finish(process, 240, []) for task, process in launchers.items()}
  finally:
    held.close()
    for process in launchers.values():
      if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
  for task, process in launchers.items():
    assert process.returncode == 0, f"{task}:\n{outputs[task][-3000:]}"
  epochs = json.loads(re.search(r"EPOCHS (.*)", outputs["worker:0"])[1])
  assert epochs == [[192, 0, 192]] * 3, epochs
  for server in ("dispatcher:0", "data_worker:0"):
    assert f"the chief at {w0} is gone for 30 s: the job is done; stopping" in \
        outputs[server], outputs[server][-3000:]


def test_each_srun_task_of_a_service_role_runs_it_with_the_services_addresses(
    write_config, monkeypatch, tmp_path):
  """`tfdist export slurm`'s script gives one srun task a role each: the service's ranks run
  `tfdist data-service`, and every rank gets the service's addresses beside TF_CONFIG."""
  from tfdist.config.loader import DATA_SERVICE_ENV
  from tfdist.job_files.slurm import sbatch_script
  from tfdist.launch.backends import slurm as slurm_backend
  from tfdist.launch.plan import plan_launch
  from tests.test_export import slurm_env
  path = write_config("cluster: {worker: 2, dispatcher: 1, data_worker: 1}\n"
                      "strategy: multi_worker_mirrored\n")
  config = tfdist.load_config(path, environ={})
  assert "#SBATCH --ntasks=4\n" in sbatch_script(config, str(path), ["python", "t.py"],
                                                 job_name="run")
  roles = [("data_worker", 0), ("dispatcher", 0), ("worker", 0), ("worker", 1)]  # Sorted jobs.
  for rank, (job, index) in enumerate(roles):
    slurm_env(monkeypatch, rank)
    resolved = slurm_backend.cluster_from_slurm(config, grpc_port=3000)
    (process,) = plan_launch(resolved, str(path), ["python", "t.py"], log_dir=str(tmp_path),
                             task=resolved.task).processes
    env = dict(process.env)
    assert json.loads(env["TF_CONFIG"])["cluster"] == {"worker": ["node2:3000", "node2:3001"]}
    assert json.loads(env[DATA_SERVICE_ENV]) == {"dispatcher": ["node1:3001"],
                                                 "data_worker": ["node1:3000"]}
    if job == "worker":
      assert process.argv[-2:] == ("python", "t.py"), process.argv
    else:
      assert process.argv[-5:] == ("tfdist", "data-service", str(path), "--task",
                                   f"{job}:{index}"), process.argv


@pytest.mark.parametrize("journal", [True, False], ids=["work_dir", "no_work_dir"])
def test_a_dispatcher_killed_mid_epoch_recovers_from_its_work_dir_and_training_goes_on(
    tmp_path, journal):
  """The dispatcher killed -9 in epoch 1 of tfdist.fit: restarted alone at its address, it
  reads its journal (`data_service.work_dir`) back, and the trainers go on through it: no
  example twice in any epoch, the epochs around it whole. Without a journal it forgot the
  jobs: the trainers stop, saying in one line what to set."""
  code, output = _fit_with_a_role_killed_midway(
      tmp_path, "dispatcher-0",
      f"data_service: {{work_dir: {tmp_path / 'journal'}}}\n" if journal else "")
  if not journal:  # A usage error: the launch ends with it, no restart tried.
    assert code == 2 and "a usage error, which no restart mends" in output, output[-4000:]
    assert "data_service.work_dir: the tf.data service's dispatcher restarted and forgot the " \
        "jobs being read (it keeps them in memory only): set data_service.work_dir" in output, \
        output[-4000:]
    return
  assert code == 0, output[-4000:]
  _epochs_around_whole_and_none_twice(output)


@pytest.mark.parametrize("words", [
    "The dispatcher is not configured to be fault tolerant, so it cannot recover job 3",
    "Failed to get element from worker 127.0.0.1:40931: Failed to get an element, with a "
    "nonretryable error: Failed to get element: Failed to get split: Iteration id 2001 not "
    "found"])
def test_each_of_tensorflows_words_for_a_forgetful_dispatcher_is_said_in_one_line(words):
  """The second came first in one suite's run of the test above (its data worker asked the
  restarted dispatcher for a split before its reader asked about the job)."""
  import tensorflow as tf
  from tfdist.data_service import reading
  with pytest.raises(tfdist.ConfigError, match="^data_service.work_dir: the tf.data service's "
                     "dispatcher restarted and forgot the jobs being read"):
    with reading.dispatcher_restarts_explained():
      raise tf.errors.NotFoundError(None, None, words)
  with pytest.raises(tf.errors.NotFoundError):  # Anything else is TensorFlow's own error.
    with reading.dispatcher_restarts_explained():
      raise tf.errors.NotFoundError(None, None, "Iteration of dataset 4 ended")


def test_a_journal_without_a_dispatcher_is_refused_in_one_line():
  with pytest.raises(tfdist.ConfigError, match=re.escape(
      "data_service.work_dir: is the tf.data service dispatcher's journal: give the cluster "
      "cluster.dispatcher and cluster.data_worker, or leave it out. Received: '/tmp/j'")):
    tfdist.load_config({"cluster": {"worker": 2}, "data_service": {"work_dir": "/tmp/j"}})


def test_parameter_server_workers_share_each_pass_of_the_service(tmp_path):
  """Under parameter_server the workers read one endless stream of passes, each pass shared:
  an epoch (12 steps of 16, the coordinator's) trains on nearly every example once. Workers
  reading a pass each would train on about half of them twice in every epoch."""
  output = _trained(tmp_path, "cluster: {chief: 1, worker: 2, ps: 1, dispatcher: 1, "
                              "data_worker: 1}\nstrategy: parameter_server\ntraining: "
                              "{global_batch_size: 16, steps_per_epoch: 12, "
                              "steps_per_execution: 1}\n")
  epochs = json.loads(re.search(r"\[chief-0\] EPOCHS (.*)", output)[1])
  # A worker can move on to the next pass while the other still holds batches of this one:
  # at most 3 (its reader's buffer, `reading.endless_passes`), so at most 3 batches of an
  # epoch repeat ids. With TensorFlow's default buffer a reader took a whole pass ahead, and 2
  # of 8 runs had 4 batches astray ([64, 64, 128]; a suite's run failed so).
  for once, again, trained in epochs:
    assert again <= 48 and trained >= 192 - 48, epochs


def test_a_reader_of_the_parameter_server_stream_holds_at_most_three_batches_of_a_pass():
  """Parameter-server workers read `endless_passes` each at its own pace: what one holds of a
  pass when another moves on is what an epoch of steps can take twice (the test above). Reader
  A reads one batch (ids 0-15), then reader B its first: 64 or less, the pass's 5th batch at
  most (A holds at most 3). With TensorFlow's default buffer A had fetched the whole pass and
  B's first was the next pass's (id 0)."""
  import time
  import tensorflow as tf
  from tfdist.data_service import reading
  service = tf.data.experimental.service
  dispatcher = service.DispatchServer()
  worker = service.WorkerServer(service.WorkerConfig(
      dispatcher_address=dispatcher.target.removeprefix("grpc://")))
  try:
    stream = reading.endless_passes(tf.data.Dataset.range(192).batch(16),
                                    service=dispatcher.target)
    a = iter(stream)
    assert int(next(a)[0]) == 0
    time.sleep(1)  # A's reader fetches ahead meanwhile, as far as it may.
    assert 16 <= int(next(iter(stream))[0]) <= 64
  finally:
    worker._stop()
    dispatcher._stop()


def test_a_pass_ends_for_its_reader_soon_after_its_last_batch():
  """A reader learns that its pass ended when it next asks the dispatcher about the job. At
  TensorFlow's own interval (the public `from_dataset_id`) that is a second after the job
  began: 3 short passes take 2.4 s or more (that half fails once TensorFlow ends passes sooner by
  itself: then `reading.TASK_REFRESH_MS` can go). tfdist's readers (`reading._passes`) ask every
  0.1 s: the same passes in under 0.6 s each, in at least one of 5 tries (a loaded machine may
  stall some; nothing but the refresh makes TensorFlow's floor)."""
  import time
  import tensorflow as tf
  from tfdist.data_service import reading
  service = tf.data.experimental.service
  dispatcher = service.DispatchServer()
  worker = service.WorkerServer(service.WorkerConfig(
      dispatcher_address=dispatcher.target.removeprefix("grpc://")))
  dataset = tf.data.Dataset.range(8).batch(2)
  passes = 3

  def seconds(one_pass):
    began = time.monotonic()
    for number in range(passes):
      assert [int(b[0]) for b in one_pass(number)] == [0, 2, 4, 6]
    return time.monotonic() - began

  try:
    ours = reading._passes(dataset, dispatcher.target, reading.new_token(), "read")
    ids = service.register_dataset(dispatcher.target, dataset)
    plain = seconds(lambda n: service.from_dataset_id(
        "distributed_epoch", dispatcher.target, ids, dataset.element_spec, job_name=f"plain-{n}"))
    assert plain >= 0.8 * passes, plain  # TensorFlow's own: a second a pass.
    tries = [seconds(lambda n, t=t: ours(tf.constant(10 * t + n, tf.int64))) for t in range(5)]
    assert min(tries) < 0.6 * passes, (plain, tries)  # Measured 0.12 s a pass.
  finally:
    worker._stop()
    dispatcher._stop()
