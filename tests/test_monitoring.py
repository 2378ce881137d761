"""TensorBoard for the whole cluster: the config's `tensorboard:` section under a real 2-worker
MultiWorkerMirrored launch and a parameter-server launch, the event files read back with
TensorBoard's own EventAccumulator; `tfdist tensorboard` answering over HTTP on 127.0.0.1."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import urllib.request

import keras
import numpy as np
import portpicker
import psutil
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import tfdist
from tfdist.machine.ports import accepts
from tests.conftest import PROGRAMS, REPO
from tests.launching import ENV, finish, read_until, start_launch

TRAINING = ("training: {global_batch_size: 64, epochs: 3, mixed_precision: off, "
            "steps_per_execution: 4%s}\n")
CONFIGS = {
    "mwms": "cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n" + TRAINING % "",
    "ps": "cluster: {chief: 1, worker: 2, ps: 1}\nstrategy: parameter_server\n"
          + TRAINING % ", steps_per_epoch: 16",
}


def scalars(directory):
  """{tag: [(step, value), ...]} of every event file in `directory`, and the files per tag."""
  values, files = {}, {}
  for path in sorted(pathlib.Path(directory).glob("events.out.tfevents.*")):
    events = EventAccumulator(str(path), size_guidance={"tensors": 0})
    events.Reload()
    for tag in events.Tags()["tensors"]:
      points = [(e.step, tf_value(e).item()) for e in events.Tensors(tag)]
      values.setdefault(tag, []).extend(points)
      files.setdefault(tag, []).append(path.name)
  return values, files


def tf_value(event):
  from tensorboard.util import tensor_util
  return tensor_util.make_ndarray(event.tensor_proto)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  base, cache = tmp_path_factory.mktemp("monitoring"), {}

  def run(name):
    if name not in cache:
      out = base / name
      out.mkdir()
      config = out / "config.yaml"
      config.write_text(CONFIGS[name] + f"tensorboard: {{log_dir: {out / 'tb'}, update_freq: "
                        "batch, profile_batches: [2, 3]}\n")
      launcher = start_launch(str(config), "--logs", str(out / "launch"), "--", sys.executable,
                              str(PROGRAMS / "user_script.py"), str(out / "files"), "dataset")
      output = finish(launcher, 240, [])
      assert launcher.returncode == 0, output[-3000:]
      cache[name] = out / "tb" / "launch"  # The run is named after the launch's log directory.
    return cache[name]
  return run


def test_the_chiefs_curves_are_written_once_and_other_tasks_keep_their_own(runs):
  run = runs("mwms")
  assert sorted(p.name for p in run.iterdir()) == ["launcher", "plugins", "train", "validation",
                                                   "worker-1"]
  train, files = scalars(run / "train")
  assert len(files["epoch_loss"]) == 1
  assert [step for step, _ in train["epoch_loss"]] == [0, 1, 2]
  # Batch steps are optimizer steps (4 per call), not calls, over the 3 epochs of 16 steps.
  assert [step for step, _ in train["batch_loss"]] == list(range(4, 49, 4))
  assert {"epoch_steps_per_second", "epoch_examples_per_second", "epoch_flops_per_second",
          "epoch_mfu"} <= set(train)
  parameters = 64 * 32 + 32 + 32 * 10 + 10  # The script's model.
  for (_, examples), (_, flops), (_, mfu) in zip(train["epoch_examples_per_second"],
                                                 train["epoch_flops_per_second"],
                                                 train["epoch_mfu"]):
    assert flops == pytest.approx(6 * parameters * examples, rel=1e-5)
    assert 0 < mfu < 1
  validation, _ = scalars(run / "validation")
  assert [step for step, _ in validation["epoch_loss"]] == [0, 1, 2]
  worker, _ = scalars(run / "worker-1")
  split = {"epoch_input_wait_ms", "epoch_compute_ms", "epoch_collective_wait_ms"}
  assert set(worker) == {"epoch_steps_per_second", "epoch_examples_per_second"} | split
  assert all(value > 0 for _, value in worker["epoch_examples_per_second"])
  assert split | {"epoch_straggler_ratio", "straggler"} <= set(train)
  assert all(value >= 0 for tag in split for _, value in worker[tag] + train[tag])


def test_a_worker_with_a_slow_input_pipeline_is_named_the_straggler(tmp_path):
  config = tmp_path / "config.yaml"
  config.write_text(CONFIGS["mwms"] + f"tensorboard: {{log_dir: {tmp_path / 'tb'}}}\n")
  launcher = start_launch(str(config), "--logs", str(tmp_path / "launch"), "--", sys.executable,
                          str(PROGRAMS / "straggler.py"), "worker-1", "0.03")
  output = finish(launcher, 240, [])
  assert launcher.returncode == 0, output[-3000:]
  train, _ = scalars(tmp_path / "tb" / "launch" / "train")
  lines = [text.decode() for _, text in train["straggler"]]
  ratios = [value for _, value in train["epoch_straggler_ratio"]]
  # Every epoch after the first (which traces and builds) names it. (A balanced cluster's "no
  # straggler" is checked on data below: on shared cores any worker may lag an epoch.)
  assert all(line.startswith("straggler: worker-1,") for line in lines[1:]), lines
  assert min(ratios[1:]) > 1.5, ratios
  assert re.search(r"\[worker-0\] tfdist: epoch 3: straggler: worker-1, .* chronic: ", output)
  # Its wait for input bounds the job: said once, with what to do on this host (2 workers on
  # 2 cores: no core free for data workers here).
  advice = (r", and this host's \d+ cores run 2 of the cluster's processes: make the pipeline "
            r"cheaper" if (os.cpu_count() or 1) <= 2 else
            r": run the input pipeline on tf.data service")
  said = re.findall(r"\[worker-0\] tfdist: epoch \d: input-bound: the steps waited for their "
                    r"input \d+% of their time" + advice, output)
  assert len(said) == 1, output[-3000:]
  worker, _ = scalars(tmp_path / "tb" / "launch" / "worker-1")
  # The slow worker waits for its input; its fast peer waits for it in the collectives.
  assert worker["epoch_input_wait_ms"][-1][1] > 10 > train["epoch_input_wait_ms"][-1][1]
  assert train["epoch_collective_wait_ms"][-1][1] > 10


def test_the_straggler_is_the_slowest_in_input_and_compute_against_the_median():
  from tfdist.monitoring.step_times import Stragglers, straggler
  assert straggler({"chief-0": [0.0, 5.0, 1.0]}) == (None, 1.0)
  assert straggler({"worker-0": [0.2, 0.1, 9], "worker-1": [0.5, 0.1, 9]})[0] is None  # < 1 ms.
  name, ratio = straggler({f"worker-{i}": [1.0, 10.0, 5.0] for i in range(3)} |
                          {"worker-3": [30.0, 10.0, 0.0]})
  assert name == "worker-3" and ratio == pytest.approx(40 / 11)
  stragglers = Stragglers()
  line, _, named = stragglers.line({"worker-0": [1.0, 10.0, 5.0], "worker-1": [1.2, 10.0, 4.8]})
  assert line.startswith("no straggler (slowest input+compute 1.0") and not named
  stragglers.line({"worker-0": [0, 5, 60], "worker-1": [55, 5, 2]})
  line, _, named = stragglers.line({"worker-0": [0, 5, 60], "worker-1": [55, 5, 2]})
  assert named and line.endswith("chronic: 2 of 3 epochs")  # Named in 2 of the 3 epochs.


def test_the_launchers_events_are_text_summaries_of_the_run(runs):
  events, _ = scalars(runs("mwms") / "launcher")
  lines = [text.decode() if isinstance(text, bytes) else str(text)
           for _, text in events["launcher"]]
  assert lines[0].startswith("tfdist launch: 2 process(es)")
  assert any(re.fullmatch(r"worker-1 started \(pid \d+\) at 127\.0\.0\.1:\d+, log "
                          r"\S+worker-1\.log", line) for line in lines)
  assert lines[-1] == "every task finished: done"


def test_a_profile_is_written_for_the_configured_batches_on_the_chief(runs):
  traces = list((runs("mwms") / "plugins" / "profile").glob("*/*.xplane.pb"))
  assert len(traces) == 1 and traces[0].stat().st_size > 0


def test_parameter_server_runs_log_the_chiefs_curves(runs):
  run = runs("ps")
  assert sorted(p.name for p in run.iterdir()) == ["launcher", "plugins", "train", "validation"]
  train, files = scalars(run / "train")
  assert len(files["epoch_loss"]) == 1 and [s for s, _ in train["epoch_loss"]] == [0, 1, 2]
  # Every step of each 16-step epoch done by one of the two workers, none retried.
  done = [a + b for (_, a), (_, b) in zip(train["worker_steps/worker-0"],
                                          train["worker_steps/worker-1"])]
  assert done == [16, 16, 16]
  assert [value for _, value in train["epoch_retried_steps"]] == [0, 0, 0]
  assert all(0 < value < 1000 for _, value in train["epoch_ps_round_trip_ms"])


class StopAfter(keras.callbacks.Callback):
  def on_epoch_begin(self, epoch, logs=None):
    if epoch == 2:  # A crash once epochs 0 and 1 are logged and backed up.
      raise KeyboardInterrupt


@pytest.mark.usefixtures("two_cpus")  # In this process: devices split before TensorFlow starts.
def test_a_resumed_run_continues_its_curves(tmp_path, monkeypatch):
  monkeypatch.setenv("TFDIST_RUN", "resumed")
  config = {"training": {"global_batch_size": 16, "epochs": 4, "steps_per_execution": 2,
                         "mixed_precision": "off"},
            "checkpoint": {"dir": str(tmp_path / "ckpt")},
            "tensorboard": {"log_dir": str(tmp_path / "tb"), "update_freq": "batch"}}
  x, y = np.random.default_rng(0).random((64, 4), dtype=np.float32), np.arange(64) % 3
  args = dict(config=config, compile=dict(optimizer="sgd", loss=keras.losses.
                                          SparseCategoricalCrossentropy(from_logits=True)),
              verbose=0, shuffle=False)
  model_fn = lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
  with pytest.raises(KeyboardInterrupt):
    tfdist.fit(model_fn, x, y, callbacks=[StopAfter()], **args)
  tfdist.fit(model_fn, x, y, **args)
  train, files = scalars(tmp_path / "tb" / "resumed" / "train")
  assert len(files["epoch_loss"]) == 2  # Two segments ...
  assert [s for s, _ in train["epoch_loss"]] == [0, 1, 2, 3]  # ... of one curve.
  assert [s for s, _ in train["batch_loss"]] == list(range(2, 17, 2))


@pytest.mark.parametrize("how", ["tensorboard", "tensorboard --bind-all", "launch --tensorboard"])
def test_tensorboard_from_the_cli_serves_the_scalars(runs, how, write_config):
  """`tfdist tensorboard` on loopback (or every interface with --bind-all), and the one a
  launch starts beside its tasks with `--tensorboard` (on the config's log directory, stopped
  with the launch)."""
  run = runs("mwms")
  if how == "launch --tensorboard":
    config = write_config(f"tensorboard: {{log_dir: {run.parent}}}\n")
    argv = ["launch", str(config), "--tensorboard", "--logs", str(config.parent / "logs"), "--",
            sys.executable, "-c", "import time; time.sleep(120)"]
  else:  # The port asked for (a free one when not).
    argv = [*how.split(), str(run.parent), "--port", str(portpicker.pick_unused_port())]
  server = subprocess.Popen([sys.executable, "-m", "tfdist", *argv], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
  try:
    seen = []
    match = read_until(server, r"at http://(127\.0\.0\.1|0\.0\.0\.0):(\d+)/", 90, seen)
    assert match.group(1) == ("0.0.0.0" if "bind-all" in how else "127.0.0.1"), seen
    if how.startswith("launch"):  # Its signals are the launch's once its task started.
      read_until(server, r"local started \(pid", 90, seen)
    port = int(match.group(2))
    assert how.startswith("launch") or argv[-1] == str(port), seen
    listening = {c.laddr.ip for c in psutil.net_connections("inet")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
    assert listening == ({"0.0.0.0"} if "bind-all" in how else {"127.0.0.1"}) or \
        ("bind-all" in how and listening == {"::"}), listening
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 60
    while True:
      tags = json.loads(urllib.request.urlopen(url + "data/plugin/scalars/tags").read())
      if "launch/train" in tags or time.monotonic() > deadline:
        break
      time.sleep(0.5)
    assert {"epoch_loss", "batch_loss"} <= set(tags["launch/train"])
    query = "data/plugin/scalars/scalars?run=launch%2Ftrain&tag=epoch_loss"
    points = json.loads(urllib.request.urlopen(url + query).read())
    assert [step for _, step, _ in points] == [0, 1, 2]
    os.killpg(server.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group.
    # TensorBoard's own server ignores SIGINT; tfdist's SIGTERM ends it (the time:
    # bench_launcher_reactions).
    assert server.wait(timeout=60) == (0 if how.startswith("tensorboard") else 128 + 2)
    assert not accepts(f"127.0.0.1:{port}")  # TensorBoard stopped with it.
  finally:
    if server.poll() is None:
      server.kill()
      server.wait()


def test_a_job_is_input_bound_when_a_worker_waits_for_input_half_its_step():
  from tfdist.monitoring.step_times import INPUT_BOUND, input_bound_line, input_share
  # By hand: worker-1 waits 8 of its 10 ms; the balanced cluster at most 2 of 10.
  assert input_share({"worker-0": [0.5, 4.0, 5.5], "worker-1": [8.0, 1.0, 1.0]}) == 0.8
  assert input_share({"worker-0": [2.0, 6.0, 2.0], "worker-1": [1.0, 7.0, 2.0]}) == 0.2
  assert input_share({"chief-0": [0.0, 0.0, 0.0]}) == 0.0 < INPUT_BOUND == 0.5
  assert input_bound_line(0.8, 2) == ("input-bound: the steps waited for their input 80% of "
                                      "their time; 2 data workers run the pipeline: add more "
                                      "(cluster.data_worker)")
  assert "run the input pipeline on tf.data service data workers (cluster.dispatcher" in \
      input_bound_line(0.8, 0)


@pytest.mark.parametrize("data_workers,said", [
    (2, "input-bound: the steps waited for their input 80% of their time; 2 data workers run "
        "the pipeline, and this host's 2 cores run 5 of the cluster's processes: more data "
        "workers here would not help; run them on other hosts, or make the pipeline cheaper"),
    (0, "input-bound: the steps waited for their input 80% of their time, and this host's 2 "
        "cores run 5 of the cluster's processes: make the pipeline cheaper, or run it on "
        "tf.data service data workers on other hosts"),
])
def test_input_bound_advice_fits_a_host_whose_cores_are_all_busy(data_workers, said):
  """Before, "add more (cluster.data_worker)" on a 2-core machine running 5 processes."""
  from tfdist.monitoring.step_times import Host, input_bound_line
  assert input_bound_line(0.8, data_workers, Host(cores=2, processes=5)).startswith(said)
  assert "add more" in input_bound_line(0.8, 2, Host(cores=16, processes=5))
  assert "add more" in input_bound_line(0.8, 2, Host(cores=2, processes=None))


def test_a_task_behind_waiting_for_the_services_batches_is_named_an_input_wait():
  from tfdist.monitoring.step_times import input_waits_line, straggler
  rows = {"worker-0": [0.0, 5.0, 60.0], "worker-1": [55.0, 5.0, 2.0]}
  name, ratio = straggler(rows)
  assert input_waits_line(name, ratio, rows) == (
      "input waits, not a slow worker: worker-1 waited 55.0 ms a step for its batches from "
      "the tf.data service (compute 5.0 ms), 1.85x the median's input+compute")


def test_the_tasks_on_a_host_are_counted_from_the_clusters_addresses():
  from tfdist.config.roles import tasks_on_this_host
  config = {"cluster": {"worker": ["10.0.0.1:1", "10.0.0.1:2"], "dispatcher": ["10.0.0.1:3"],
                        "data_worker": ["10.0.0.2:1", "10.0.0.1:4"]},
            "task": {"type": "worker", "index": 1}}
  assert tasks_on_this_host(config) == 4
  assert tasks_on_this_host({"cluster": {"worker": 2}, "task": {"type": "worker",
                                                                "index": 0}}) is None
