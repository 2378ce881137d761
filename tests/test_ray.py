"""`tfdist launch --backend ray` against a real local Ray: a head started here with `ray start
--head --block` (bounded, stopped by its process id), every task a Ray actor. A 2-worker
MultiWorkerMirrored job equals plain Keras on one device; a parameter-server job converges; a
killed worker restarts the cluster, and SIGINT then leaves no actor and no task alive; a bad
RAY_ADDRESS and a missing Ray are refused in one line."""

import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import portpicker
import psutil
import pytest

from tests.conftest import PROGRAMS, RAY_LOOPBACK as LOOPBACK, REPO
from tests.launching import ENV, finish, read_until, running, start_launch

pytest.importorskip("ray", reason="the ray extra is not installed")

pytestmark = pytest.mark.usefixtures("two_cpus")  # In-process references: the suite's devices.
_MARK = "TFDIST_RAY_TEST_HEAD"  # Carried by every process of the head: its workers, their tasks.
_START_S = 90


@pytest.fixture(scope="module")
def ray_head():
  """A local Ray head on 127.0.0.1 with 4 CPUs; yields its address (RAY_ADDRESS)."""
  port, dashboard = portpicker.pick_unused_port(), portpicker.pick_unused_port()
  temp = f"/tmp/tfdist-ray-{os.getpid()}"  # Short: Ray's sockets live there.
  env = {key: value for key, value in ENV.items() if key != "TFDIST_TEST_SESSION"}
  env.update({_MARK: str(os.getpid()), "RAY_USAGE_STATS_ENABLED": "0", **LOOPBACK})
  head = subprocess.Popen(
      ["ray", "start", "--head", "--block", f"--port={port}", "--num-cpus=4",
       "--include-dashboard=true", "--dashboard-host=127.0.0.1",
       f"--dashboard-port={dashboard}", f"--temp-dir={temp}", "--disable-usage-stats"],
      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
  address = f"127.0.0.1:{port}"
  try:
    _wait_until_ready(head, address)
    yield address
  finally:
    # SIGKILL: `ray start --block` left its GCS running for 15 s and more after a SIGTERM.
    os.killpg(head.pid, signal.SIGKILL)
    head.wait()
    _, left = psutil.wait_procs(_marked(), timeout=10)  # Tasks die with their actors.
    for process in left:
      process.kill()
    shutil.rmtree(temp, ignore_errors=True)
    assert not left, f"the Ray head left processes: {[p.pid for p in left]}"


def _wait_until_ready(head, address):
  from ray.util.state import list_nodes
  deadline = time.monotonic() + _START_S
  while time.monotonic() < deadline:
    assert head.poll() is None, head.stdout.read().decode()[-3000:]
    try:
      if any(node.state == "ALIVE" for node in list_nodes(address=address, timeout=5)):
        return
    except Exception:  # pylint: disable=broad-except  # Not up yet.
      pass
    time.sleep(1)
  pytest.fail(f"the Ray head did not come up in {_START_S} s")


def _marked() -> list[psutil.Process]:
  found = []
  for process in psutil.process_iter():
    try:
      if process.environ().get(_MARK) == str(os.getpid()):
        found.append(process)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
      pass
  return found


def alive_actors(address):
  from ray.util.state import list_actors
  return [a for a in list_actors(address=address, timeout=10)
          if a.class_name == "TaskActor" and a.state != "DEAD"]


def ray_launch(address, config, tmp_path, *args):
  return start_launch(str(config), "--backend", "ray", "--logs", str(tmp_path / "logs"),
                      "--verbose", *args, env={"RAY_ADDRESS": address, **LOOPBACK})


def results(output):
  return {name: json.loads(text)
          for name, text in re.findall(r"\[(\S+)\] RESULT plain (.*)", output)}


def test_two_workers_equal_plain_keras_on_one_device(ray_head, write_config, tmp_path):
  from tests.programs import equivalence_case as case
  from tests.test_fit import assert_same_training

  config = write_config("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
  folders = set(pathlib.Path(tempfile.gettempdir()).glob("tfdist-ray-task-*"))
  launcher = ray_launch(ray_head, config, tmp_path, "--", sys.executable,
                        str(PROGRAMS / "equivalence_case.py"), "plain")
  output = finish(launcher, 240, [])
  assert launcher.returncode == 0, output[-3000:]
  # Each task's address is its actor's node and a port picked there.
  assert re.search(r'TF_CONFIG=\{"cluster": \{"worker": \["127\.0\.0\.1:\d+", '
                   r'"127\.0\.0\.1:\d+"\]\}', output), output[:3000]
  found = results(output)
  assert sorted(found) == ["worker-0", "worker-1"], output[-3000:]
  reference = case.train_plain("plain")
  for result in found.values():
    assert_same_training(result, reference, "plain")
  assert "RESULT plain " in (tmp_path / "logs" / "worker-1.log").read_text()
  assert alive_actors(ray_head) == []
  # Each actor's folder (its heartbeat, the files it wrote) goes with it.
  assert set(pathlib.Path(tempfile.gettempdir()).glob("tfdist-ray-task-*")) <= folders


def test_the_tf_data_service_roles_run_as_actors_and_each_example_is_trained_on_once(
    ray_head, write_config, tmp_path):
  """The dispatcher and data worker are actors like the trainers; the trainers read through
  them each of 192 examples once in each epoch (a hand count)."""
  config = write_config("cluster: {worker: 2, dispatcher: 1, data_worker: 1}\n"
                        "strategy: multi_worker_mirrored\ntraining: {global_batch_size: 16}\n")
  launcher = ray_launch(ray_head, config, tmp_path, "--", sys.executable,
                        str(PROGRAMS / "data_service_fit.py"))
  output = finish(launcher, 240, [])
  assert launcher.returncode == 0, output[-3000:]
  assert re.search(r'TFDIST_DATA_SERVICE=\{"dispatcher": \["127\.0\.0\.1:\d+"\], '
                   r'"data_worker": \["127\.0\.0\.1:\d+"\]\}', output), output[:3000]
  epochs = json.loads(re.search(r"\[worker-0\] EPOCHS (.*)", output)[1])
  assert epochs == [[192, 0, 192]] * 3, epochs
  assert alive_actors(ray_head) == []


def test_parameter_server_job_converges(ray_head, write_config, tmp_path):
  config = write_config(
      "cluster: {chief: 1, worker: 2, ps: 1}\nstrategy: parameter_server\n"
      "training: {global_batch_size: 32, steps_per_epoch: 30, steps_per_execution: 5, "
      "epochs: 3, mixed_precision: 'off'}\n")
  launcher = ray_launch(ray_head, config, tmp_path, "--", sys.executable,
                        str(PROGRAMS / "ps_fit.py"))
  output = finish(launcher, 240, [])
  assert launcher.returncode == 0, output[-3000:]
  (line,) = re.findall(r"\[chief-0\] RESULT (.*)", output)
  chief = json.loads(line)
  assert chief["iterations"] == 3 * 30 and chief["workers_running_steps"] == 2
  assert chief["history"]["val_loss"][-1] < 0.05 * chief["history"]["loss"][0], chief
  assert "[tfdist launch] ps-0 started" in output
  assert alive_actors(ray_head) == []


def test_killed_worker_restarts_then_sigint_leaves_no_actor(ray_head, write_config, tmp_path):
  config = write_config("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n"
                        f"checkpoint: {{dir: {tmp_path / 'checkpoints'}}}\n")
  launcher = ray_launch(ray_head, config, tmp_path, "--grace-period", "5", "--max-restarts",
                        "1", "--", "env", "PAUSE_AFTER_EPOCH=3", sys.executable,
                        str(PROGRAMS / "resumable.py"))
  seen = []
  try:
    read_until(launcher, r"\[worker-1\] EPOCH_END 2", 240, seen)
    worker_1 = int(re.search(r"\[worker-1\] PID (\d+)", "".join(seen)).group(1))
    os.kill(worker_1, signal.SIGKILL)  # Its actor lives on: the task failed, not the actor.
    read_until(launcher, r"\[worker-1\] EPOCH_BEGIN 3", 240, seen)
    after = "".join(seen).split("restarting the whole cluster", 1)[1]
    tasks = [int(p) for p in re.findall(r"\[worker-\d\] PID (\d+)", after)]
    os.killpg(launcher.pid, signal.SIGINT)  # As Ctrl-C in a terminal.
    output = finish(launcher, 120, seen)
  finally:
    if launcher.poll() is None:
      os.killpg(launcher.pid, signal.SIGKILL)
  before = output.split("restarting the whole cluster", 1)[0]
  assert "worker-1 failed first (exit code -9): the root cause" in before, before[-3000:]
  assert re.findall(r"\[worker-1\] EPOCH_BEGIN (\d)", after) == ["3"]  # Resumed at epoch 4.
  assert launcher.returncode == 130, output[-3000:]
  assert "SIGINT received: forwarded to every task" in output
  assert alive_actors(ray_head) == []
  assert len(tasks) == 2 and not any(running(pid) for pid in tasks)


def test_the_launchers_variables_reach_the_tasks_but_not_its_hosts_own():
  from tfdist.launch.backends.ray import forwarded
  environ = {"WANDB_PROJECT": "p", "PYTHONPATH": "/code", "PATH": "/venv/bin:/usr/bin",
             "HOSTNAME": "laptop", "HOME": "/home/me", "PWD": "/code", "SSH_AUTH_SOCK": "/s",
             "XDG_RUNTIME_DIR": "/run/1", "RAY_ADDRESS": "10.0.0.5:6379"}
  assert forwarded(environ) == {"WANDB_PROJECT": "p", "PYTHONPATH": "/code",
                                "PATH": "/venv/bin:/usr/bin"}


def test_a_tasks_port_is_held_by_its_actor_until_its_server_binds_it():
  """The port an actor gives its task (`TaskActor.node`) stays its own: another program cannot
  bind it (a port picked and let go was once taken before the task's server started), the task's
  gRPC server (SO_REUSEADDR, as TensorFlow's) can, and the actor's next answer is the same."""
  import errno
  import socket
  from tfdist.launch.backends.ray_task import TaskActor
  actor = TaskActor()
  host, port = actor.node()
  assert actor.node() == (host, port)
  with socket.socket() as other, pytest.raises(OSError) as taken:
    other.bind(("127.0.0.1", port))
  assert taken.value.errno == errno.EADDRINUSE
  with socket.socket() as server:
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen()


def test_a_worker_whose_actor_is_gone_for_good_is_dropped_and_two_finish(ray_head, tmp_path):
  """3 workers on the Ray head, `--min-workers 2`: worker-2's actor killed at epoch 1 (as when
  its node is lost: its task's failure, -9, named; its process dies with it), and its task
  failing again when started in a new actor (its node's data gone); the launch goes on with
  worker-0 and worker-1 (their actors kept) and ends with plain Keras's weights."""
  from tests.programs import elastic
  (tmp_path / "config.yaml").write_text(
      "cluster: {worker: 3}\nstrategy: multi_worker_mirrored\n"
      "training: {global_batch_size: 48, mixed_precision: 'off', steps_per_execution: 1}\n"
      f"checkpoint: {{dir: {tmp_path / 'checkpoints'}}}\n")
  marker = tmp_path / "gone"
  launcher = start_launch(str(tmp_path / "config.yaml"), "--backend", "ray", "--logs",
                          str(tmp_path / "logs"), "--verbose", "--grace-period", "5",
                          "--max-restarts", "1", "--min-workers", "2", "--", sys.executable,
                          str(PROGRAMS / "elastic.py"),
                          env={"RAY_ADDRESS": ray_head, "GONE": "worker-2",
                               "MARKER": str(marker), **LOOPBACK})
  seen = []
  try:
    read_until(launcher, r"\[worker-2\] EPOCH_BEGIN 1", 240, seen)
    task = int(re.search(r"\[tfdist launch\] worker-2 started \(pid (\d+)",
                         "".join(seen)).group(1))
    marker.touch()
    with contextlib.suppress(psutil.NoSuchProcess):
      os.kill(psutil.Process(task).ppid(), signal.SIGKILL)  # Its actor, as a lost node's.
    output = finish(launcher, 300, seen)
  finally:
    if launcher.poll() is None:
      os.killpg(launcher.pid, signal.SIGKILL)
  assert launcher.returncode == 0, output[-4000:]
  assert "worker-2 failed first (exit code -9): the root cause" in output, output[-4000:]
  assert "its Ray actor died" in output and not running(task)
  assert "worker-2 failed with no restarts left: going on without it, 2 worker(s)" in output
  got = json.loads(next(line for line in output.splitlines()
                        if "[worker-0] RESULT " in line).split("RESULT ", 1)[1])
  for g, w in zip(got, elastic.train_plain(), strict=True):
    np.testing.assert_allclose(g, w, atol=1e-5)
  assert alive_actors(ray_head) == []


@pytest.mark.parametrize("address,message", [
    ("127.0.0.1:1", r"RAY_ADDRESS: must be a running Ray cluster's address.*nothing answers "
                    r"there\. Received: '127\.0\.0\.1:1'"),
    ("http://127.0.0.1:8265", r"RAY_ADDRESS: must be .*an http address is the dashboard's"),
])
def test_a_bad_ray_address_is_refused_in_one_line(write_config, address, message):
  config = write_config("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
  result = subprocess.run([sys.executable, "-m", "tfdist", "launch", str(config), "--backend",
                           "ray", "--", "python", "train.py"], env={**ENV, "RAY_ADDRESS": address},
                          capture_output=True, text=True, timeout=120, cwd=REPO)
  assert result.returncode == 2, result.stderr
  (line,) = result.stderr.strip().splitlines()
  assert re.search(message, line), line


def test_without_ray_the_backend_names_the_extra(write_config):
  config = write_config("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
  program = ("import sys; sys.modules['ray'] = None\n"  # As where Ray is not installed.
             "from tfdist.cli.main import main\n"
             f"sys.argv = ['tfdist', 'launch', {str(config)!r}, '--backend', 'ray', '--', 'x']\n"
             "main()\n")
  result = subprocess.run([sys.executable, "-c", program], env=ENV, capture_output=True,
                          text=True, timeout=120, cwd=REPO)
  assert result.returncode == 2, result.stderr
  (line,) = result.stderr.strip().splitlines()
  assert 'needs Ray: pip install "tfdist[ray]"' in line and "--backend" in line, line


def test_a_cluster_ray_cannot_place_is_refused_before_anything_starts(ray_head, write_config):
  config = write_config("cluster: {worker: 5}\nstrategy: multi_worker_mirrored\n")
  result = subprocess.run([sys.executable, "-m", "tfdist", "launch", str(config), "--backend",
                           "ray", "--", "python", "train.py"],
                          env={**ENV, "RAY_ADDRESS": ray_head, **LOOPBACK}, capture_output=True,
                          text=True, timeout=120, cwd=REPO)
  assert result.returncode == 2, result.stderr
  (line,) = result.stderr.strip().splitlines()
  assert line.endswith("--backend: the Ray cluster has 4 CPU(s), 5 task(s) need 1 each (ray "
                       "start --num-cpus/--num-gpus, or fewer tasks). Received: 'ray'"), line
  assert alive_actors(ray_head) == []


def test_a_node_lost_then_another_added_drops_its_worker_then_takes_it_back_in(tmp_path):
  """A Ray cluster of two nodes on 127.0.0.1 (Ray's own `cluster_utils`: a head of 2 CPUs, a
  node of 1), 3 workers, `--min-workers 2 --max-restarts-per-task 0 --max-restarts 1`: the
  node's raylet killed -9 as an epoch begins (its worker dropped at once, the two others
  resuming from the backup), then a node added: Ray places the idle bundle there, the worker is
  taken back in as an epoch begins (one restart), and the launch ends with plain Keras's
  weights; the resume points are asserted."""
  from ray.cluster_utils import Cluster
  from tests.programs import elastic
  cluster = Cluster(initialize_head=True, head_node_args={
      "num_cpus": 2, "node_ip_address": "127.0.0.1", "include_dashboard": False,
      "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                         "health_check_initial_delay_ms": 0}})
  launcher = None
  try:
    lost = cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    cluster.wait_for_nodes()
    assert _listening_beyond_loopback(psutil.Process().children(recursive=True)) == []
    (tmp_path / "config.yaml").write_text(
        "cluster: {worker: 3}\nstrategy: multi_worker_mirrored\n"
        "training: {global_batch_size: 48, mixed_precision: 'off', steps_per_execution: 1}\n"
        f"checkpoint: {{dir: {tmp_path / 'checkpoints'}}}\n")
    launcher = start_launch(str(tmp_path / "config.yaml"), "--backend", "ray", "--logs",
                            str(tmp_path / "logs"), "--grace-period", "5", "--max-restarts",
                            "1", "--max-restarts-per-task", "0", "--min-workers", "2", "--",
                            sys.executable, str(PROGRAMS / "elastic.py"),
                            env={"RAY_ADDRESS": cluster.address, "PAUSE": "5", **LOOPBACK})
    seen = []
    read_until(launcher, r"\[worker-0\] EPOCH_BEGIN 1", 240, seen)
    cluster.remove_node(lost, allow_graceful=False)  # Its raylet and actors killed -9.
    dropped = read_until(launcher, r"(worker-\d) failed again past --max-restarts-per-task: "
                                   r"going on without it, 2 worker", 120, seen)[1]
    cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
    read_until(launcher, rf"{dropped} is back: taking it in as an epoch begins, 3 worker", 120,
               seen)
    output = finish(launcher, 240, seen)
  finally:
    if launcher is not None and launcher.poll() is None:
      os.killpg(launcher.pid, signal.SIGKILL)
    cluster.shutdown()
  assert launcher.returncode == 0, output[-4000:]
  assert f"{dropped} failed first (exit code -9): the root cause" in output, output[-4000:]
  assert f"Ray can place {dropped} again (a node was added)" in output, output[-4000:]
  resumed = re.findall(r"\[worker-0\] tfdist: resuming at epoch (\d) of 4", output)
  assert resumed[0] == "2" and len(resumed) == 2 and int(resumed[1]) in (3, 4), resumed
  got = json.loads(next(line for line in output.splitlines()
                        if "[worker-0] RESULT " in line).split("RESULT ", 1)[1])
  for g, w in zip(got, elastic.train_plain(), strict=True):
    np.testing.assert_allclose(g, w, atol=1e-5)


def _listening_beyond_loopback(processes) -> list[str]:
  """The TCP listeners of `processes` (by `ss`, as an administrator would look) on an address
  other than 127.0.0.1."""
  pids = {p.pid for p in processes}
  listed = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
  return [line for line in listed.splitlines()
          if {int(pid) for pid in re.findall(r"pid=(\d+)", line)} & pids and
          not re.search(r"\s(\[::ffff:)?127\.0\.0\.1\]?:\d+\s", line)]
