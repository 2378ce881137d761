"""`tfdist launch`: the plan as data, and real clusters launched through the CLI, trained to the
end, killed, restarted, interrupted and started with a missing peer."""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys

import pytest

import tfdist
from tfdist import ConfigError
from tfdist.config.schema import TaskConfig
from tfdist.launch.plan import plan_launch, public_addresses
from tests.conftest import PROGRAMS, REPO
from tests.launching import ENV, finish, read_until, run_launch, start_launch



# -- the plan ---------------------------------------------------------------------------------

def test_local_synchronous_cluster_plan(write_config, tmp_path):
  path = write_config("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
  plan = plan_launch(tfdist.load_config(path, environ={}), str(path), ["python", "train.py"],
                     log_dir=str(tmp_path), ports=[4001, 4002])
  assert plan.restart_scope == "cluster"
  assert [(p.name, p.address, p.argv, p.serves) for p in plan.processes] == [
      ("worker-0", "127.0.0.1:4001", ("python", "train.py"), False),
      ("worker-1", "127.0.0.1:4002", ("python", "train.py"), False)]
  env = dict(plan.processes[1].env)
  assert json.loads(env["TF_CONFIG"]) == {
      "cluster": {"worker": ["127.0.0.1:4001", "127.0.0.1:4002"]},
      "task": {"type": "worker", "index": 1}}
  assert env["TFDIST_CONFIG"] == str(path)
  assert plan.processes[0].log == str(tmp_path / "worker-0.log")


def test_parameter_server_plan_starts_servers_first(write_config, tmp_path):
  path = write_config("cluster: {chief: 1, worker: 2, ps: 1, evaluator: 1}\n"
                      "strategy: parameter_server\n")
  plan = plan_launch(tfdist.load_config(path, environ={}), str(path), ["python", "train.py"],
                     log_dir=str(tmp_path), ports=[1, 2, 3, 4, 5], python="py")
  assert plan.restart_scope == "task"
  assert [p.name for p in plan.processes] == ["worker-0", "worker-1", "ps-0", "chief-0",
                                              "evaluator-0"]
  assert plan.processes[2].argv == ("py", "-m", "tfdist", "cluster-server", str(path), "--task",
                                    "ps:0")
  assert plan.processes[3].argv == plan.processes[4].argv == ("python", "train.py")
  assert plan.processes[4].address is None  # An evaluator serves nothing.


def test_a_config_without_a_cluster_is_one_process(write_config, tmp_path):
  path = write_config("strategy: mirrored\ndevices: {logical_cpus: 2}\n")
  plan = plan_launch(tfdist.load_config(path, environ={}), str(path), ["python", "t.py"],
                     log_dir=str(tmp_path), fresh=True)
  (only,) = plan.processes
  assert (only.name, only.address, only.argv, only.serves) == ("local", None, ("python", "t.py"),
                                                               False)
  env = dict(only.env)
  # The script hook first on the path, then the launcher's own (tests/test_keras_contract.py
  # runs scripts that never import tfdist through it).
  assert env.pop("PYTHONPATH").split(os.pathsep) == [
      str(pathlib.Path(tfdist.__file__).parent / "script_hook"),
      *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
  assert env == {"TFDIST_CONFIG": str(path), "TFDIST_PREPARE": "1",
                 "TFDIST_FRESH": "1", "TFDIST_RUN": tmp_path.name,
                 "TFDIST_HEARTBEAT": str(tmp_path / ".local.heartbeat")}


def test_one_task_of_a_real_cluster(write_config, tmp_path):
  path = write_config('cluster: {worker: ["10.0.0.1:2222", "10.0.0.2:2222"]}\n')
  plan = plan_launch(tfdist.load_config(path, environ={}), str(path), ["python", "t.py"],
                     log_dir=str(tmp_path), task=TaskConfig("worker", 1))
  (only,) = plan.processes
  assert only.address == "10.0.0.2:2222"
  assert json.loads(dict(only.env)["TF_CONFIG"])["task"] == {"type": "worker", "index": 1}


@pytest.mark.parametrize("yaml,command,task,message", [
    ("cluster: {worker: 2}\n", [], None, r"command: must be given after --"),
    ("cluster: {worker: 2}\n", ["python"], TaskConfig("worker", 1),
     r"--task: names a task of a real cluster: give the cluster's addresses"),
])
def test_plan_errors(write_config, tmp_path, yaml, command, task, message):
  path = write_config(yaml)
  with pytest.raises(ConfigError, match=message):
    plan_launch(tfdist.load_config(path, environ={}), str(path), command, log_dir=str(tmp_path),
                ports=[1, 2], task=task)


def test_public_addresses_are_named(write_config):
  path = write_config('cluster: {worker: ["10.0.0.1:1", "127.0.0.1:2", "8.8.8.8:3", '
                      '"node-3:4", "[::1]:5"]}\n')
  assert public_addresses(tfdist.load_config(path, environ={})) == ["8.8.8.8:3"]


# -- the CLI -----------------------------------------------------------------------------------

def launch(*args, timeout=240):
  return subprocess.run([sys.executable, "-m", "tfdist", "launch", *args], env=ENV, cwd=REPO,
                        capture_output=True, text=True, timeout=timeout)


def test_dry_run_prints_the_plan_and_starts_nothing(tmp_path):
  result = launch(str(REPO / "configs" / "multi_worker_mirrored.yaml"), "--dry-run",
                  "--logs", str(tmp_path), "--", "python", "train.py")
  assert result.returncode == 0, result.stderr
  assert result.stdout.startswith("tfdist launch: 2 process(es), restart scope: cluster\n")
  assert re.search(r"worker-1 +127\.0\.0\.1:\d+ +log .*worker-1\.log\n +\$ python train\.py",
                   result.stdout)
  assert os.listdir(tmp_path) == []


def test_public_address_warning_and_missing_command(write_config):
  path = write_config('cluster: {worker: ["8.8.8.8:2222"]}\n')
  result = launch(str(path), "--task", "worker:0", "--dry-run", "--", "python")
  assert result.returncode == 0
  assert ("warning: 8.8.8.8:2222 is a public address; TensorFlow's gRPC servers have no "
          "authentication") in result.stderr
  result = launch(str(path), "--task", "worker:0")
  assert result.returncode == 2
  assert result.stderr.strip().endswith("command: must be given after --, e.g. tfdist launch "
                                        "CONFIG -- python train.py. Received: 'nothing'")


def test_parameter_server_cluster_runs_its_chief_against_served_workers(write_config, tmp_path):
  path = write_config("cluster: {chief: 1, worker: 2, ps: 1}\nstrategy: parameter_server\n")
  result = launch(str(path), "--logs", str(tmp_path), "--", sys.executable,
                  str(PROGRAMS / "ps_chief.py"))
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr
  assert ("[chief-0] variable_device=/job:ps/replica:0/task:0/device:CPU:0 "
          "results=[42.0, 42.0, 42.0, 42.0]") in result.stdout


# -- faults ------------------------------------------------------------------------------------

def resumable_launch(write_config, tmp_path, *flags):
  path = write_config("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n"
                      f"checkpoint: {{dir: {tmp_path / 'checkpoints'}}}\n")
  env_command = ["env", "PAUSE_AFTER_EPOCH=3", sys.executable, str(PROGRAMS / "resumable.py")]
  return start_launch(str(path), "--logs", str(tmp_path / "logs"), "--grace-period", "2",
                      "--verbose", *flags, "--", *env_command)


def pids(output):
  return [int(p) for p in re.findall(r"\[worker-\d\] PID (\d+)", output)]


def test_killed_worker_restarts_the_cluster_which_finishes_every_epoch(write_config, tmp_path):
  seen = []
  launcher = resumable_launch(write_config, tmp_path, "--max-restarts", "1")
  read_until(launcher, r"\[worker-1\] EPOCH_END 2", 180, seen)
  worker_1 = int(re.search(r"\[worker-1\] PID (\d+)", "".join(seen)).group(1))
  os.kill(worker_1, signal.SIGKILL)
  output = finish(launcher, 240, seen)
  assert launcher.returncode == 0, output[-3000:]
  assert "worker-1 failed first (exit code -9): the root cause" in output
  assert "restarting the whole cluster" in output
  after = output.split("restarting the whole cluster", 1)[1]
  for name in ("worker-0", "worker-1"):
    epochs = re.findall(rf"\[{name}\] EPOCH_BEGIN (\d)", after)
    assert epochs == ["3", "4", "5"], after[-3000:]  # Resumed at epoch 4 of 6, to the end.
    assert f"[{name}] RESULT " in after


def test_without_restarts_a_killed_worker_ends_the_launch_naming_it(write_config, tmp_path):
  seen = []
  launcher = resumable_launch(write_config, tmp_path, "--max-restarts", "0")
  read_until(launcher, r"\[worker-1\] EPOCH_END 2", 180, seen)
  worker_1 = int(re.search(r"\[worker-1\] PID (\d+)", "".join(seen)).group(1))
  os.kill(worker_1, signal.SIGKILL)
  output = finish(launcher, 120, seen)  # A hang guard; the time: bench_launcher_reactions.
  assert launcher.returncode == 1
  assert "worker-1 failed first (exit code -9): the root cause" in output
  assert "no restarts left (--max-restarts): stopping every task" in output
  for pid in pids(output):
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)


def test_missing_peer_fails_at_the_startup_deadline_naming_it(write_config, tmp_path):
  path = write_config("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
  program = ("import json, os, time\n"
             "if json.loads(os.environ['TF_CONFIG'])['task']['index'] == 1:\n"
             "  time.sleep(600)  # Never comes up.\n"
             "import tfdist\n"
             "tfdist.make_strategy()  # Waits for its peer forever.\n")
  # 25 s: on a loaded machine worker-0's own start (importing TensorFlow) was seen past 12 s.
  result = launch(str(path), "--logs", str(tmp_path), "--startup-timeout", "25",
                  "--grace-period", "2", "--", sys.executable, "-c", program, timeout=120)
  assert result.returncode == 3, result.stdout[-3000:]
  # A line every 10 s while waiting, then the deadline. On a loaded machine this host's worker-0
  # may still be starting at 10 s, and is then named first.
  assert re.search(r"waiting for (worker-0 at 127\.0\.0\.1:\d+, )?worker-1 at 127\.0\.0\.1:\d+ "
                   r"\(\d\d s of 25 s\)", result.stdout), result.stdout[-3000:]
  assert re.search(r"start-up deadline: worker-1 at 127\.0\.0\.1:\d+ did not come up in 25 s",
                   result.stdout), result.stdout[-3000:]
  assert "worker-0" not in result.stdout.split("start-up deadline:")[1].split("\n")[0]


def test_sigint_stops_every_task(write_config, tmp_path):
  seen = []
  launcher = resumable_launch(write_config, tmp_path)
  read_until(launcher, r"\[worker-1\] EPOCH_END 0", 180, seen)
  children = pids("".join(seen))
  assert len(children) == 2
  os.killpg(launcher.pid, signal.SIGINT)  # As Ctrl-C in a terminal: the whole group.
  output = finish(launcher, 120, seen)  # A hang guard; the time: bench_launcher_reactions.
  assert launcher.returncode == 130, output[-3000:]
  assert "SIGINT received: forwarded to every task" in output
  for pid in children:
    with pytest.raises(ProcessLookupError):
      os.kill(pid, 0)


def test_readme_main_job_trains_the_example_on_a_local_two_worker_cluster(tmp_path):
  from tests import docs_blocks
  command = re.search(r'pip install -e "\.\[cpu,examples\]" && (tfdist launch .*)',
                      docs_blocks.named("the main job").code).group(1)
  argv = command.split()
  assert argv[:3] == ["tfdist", "launch", "configs/multi_worker_mirrored.yaml"]
  # The config as it is but for its /tmp/tfdist folders: a finished run's checkpoints there
  # would be resumed by the next run of the suite.
  config = tmp_path / "multi_worker_mirrored.yaml"
  config.write_text((REPO / argv[2]).read_text().replace("/tmp/tfdist", str(tmp_path / "tfdist")))
  result = launch(str(config), "--logs", str(tmp_path), *argv[3:])
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr
  assert any((tmp_path / "tfdist" / "mwms" / "checkpoints").iterdir())
  shown = re.findall(r"\[worker-0\] test loss [\d.]+ accuracy ([\d.]+) \(multi_worker_mirrored, "
                     r"2 replicas\)", result.stdout)
  logged = re.findall(r"test loss [\d.]+ accuracy ([\d.]+)", (tmp_path / "worker-1.log").read_text())
  assert len(shown) == len(logged) == 1 and float(shown[0]) == float(logged[0]) > 0.85
  # The terminal shows the chief's output only; each task's is in its log.
  assert "[worker-1]" not in result.stdout, result.stdout[-3000:]
  assert "[tfdist launch] every task finished: done" in result.stdout, result.stdout[-3000:]


def test_a_launch_of_several_cpu_workers_on_one_host_advises_one_worker_with_every_core(
    write_config):
  from tfdist.launch.plan import plan_launch
  config = tfdist.load_config(write_config("cluster: {worker: 2}\n"
                                           "strategy: multi_worker_mirrored\n"), environ={})
  plan = plan_launch(config, "c.yaml", ["python", "t.py"], log_dir="logs", ports=[1, 2])
  assert plan.describe().splitlines()[-1].startswith(
      "advice: 2 workers share one host's CPU cores; on CPUs one worker per host")
  with_gpus = plan_launch(config, "c.yaml", ["python", "t.py"], log_dir="logs", ports=[1, 2],
                          gpus=["0", "1"])
  assert with_gpus.advice == ()


def test_a_task_past_its_restarts_per_task_ends_the_launch_while_the_clusters_are_left(
    write_config, tmp_path):
  """`--max-restarts-per-task 1` within `--max-restarts 3`: worker-1 failing at every start
  causes one restart, and its second failure ends the launch naming the flag, the cluster's
  budget not spent. The tasks import no TensorFlow: worker-1 exits 3, worker-0 waits."""
  path = write_config("cluster: {worker: 2}\n")
  task = ("import json, os, sys, time; t = json.loads(os.environ['TF_CONFIG'])['task']; "
          "print('START', t['index'], flush=True); "
          "sys.exit(3) if t['index'] == 1 else time.sleep(60)")
  launcher = start_launch(str(path), "--max-restarts", "3", "--max-restarts-per-task", "1",
                          "--grace-period", "1", "--logs", str(tmp_path / "logs"), "--verbose",
                          "--", sys.executable, "-c", task)
  output = finish(launcher, 120, [])
  assert launcher.returncode == 1, output[-3000:]
  assert output.count("[worker-1] START 1") == 2, output[-3000:]
  assert output.count("restarting the whole cluster (2 restart(s) left after this)") == 1
  assert "worker-1 may cause no more restarts (--max-restarts-per-task): stopping every task" \
      in output, output[-3000:]
  assert "its failures caused the 1 restart(s) one task may cause (--max-restarts-per-task); " \
         "exit code 1" in output, output[-3000:]


@pytest.mark.usefixtures("two_cpus")
@pytest.mark.parametrize("verbose", [False, True])
def test_the_terminal_says_one_line_per_task_before_training_the_environment_with_verbose(
    verbose, tmp_path):
  """The shipped 2-worker config under the default flags: before the first task's output,
  each task is named on one line (its pid, address and log as it starts); the commands and
  environment (TF_CONFIG) are --verbose's and --dry-run's. Before, 16 of 23 lines were the
  two workers' environment."""
  config = (REPO / "configs" / "multi_worker_mirrored.yaml").read_text().replace(
      "/tmp/tfdist", str(tmp_path))
  code, output = run_launch(tmp_path, config, "steps.py", env={"STEPS": "10"},
                            flags=("--verbose",) if verbose else ())
  assert code == 0, output[-3000:]
  before = [line for line in output[:output.index("] PID ")].splitlines()[:-1]
            if "] waiting for " not in line]  # Said 10 s into a slow start: not per task.
  for task in ("worker-0", "worker-1"):
    named = [line for line in before if task in line]
    if verbose:
      assert any("TF_CONFIG=" in line for line in before), before
    else:
      assert len(named) == 1 and re.fullmatch(
          rf"\[tfdist launch\] {task} started \(pid \d+\) at 127\.0\.0\.1:\d+, log "
          rf"{tmp_path}/logs/{task}\.log", named[0]), before
  if not verbose:
    assert "TF_CONFIG" not in output and len(before) <= 5, before
