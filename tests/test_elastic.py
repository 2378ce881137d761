"""Elastic membership (`tfdist launch --min-workers`): 3 local workers, one gone for good at
epoch 2 (it fails there, and again right after `import tfdist` when restarted); the launch goes
on with 2 from the backup, at the same global batch, and ends with plain Keras's weights on one
device. Below the minimum it fails naming the workers lost. Real launches on 127.0.0.1."""

import json
import re
import os
import signal
import sys

import numpy as np
import psutil
import pytest

from tests.conftest import PROGRAMS
from tfdist.machine.ports import HeldPorts
from tests.launching import finish, read_until, start_launch
from tests.programs import elastic

CONFIG = ("cluster: {{worker: 3}}\nstrategy: multi_worker_mirrored\n"
          "training: {{global_batch_size: 48, mixed_precision: 'off', steps_per_execution: 1}}\n"
          "checkpoint: {{dir: {dir}}}\n")
BOARD = "tensorboard: {{log_dir: {board}}}\n"


def _launch(tmp_path, *flags, loop=False, board=False, gone_at=2):
  (tmp_path / "config.yaml").write_text(CONFIG.format(dir=tmp_path / "checkpoints") + (
      BOARD.format(board=tmp_path / "board") if board else ""))
  env = {"GONE": "worker-2", "MARKER": str(tmp_path / "gone"), "GONE_AT": str(gone_at),
         **({"LOOP": "1"} if loop else {"CONFIG": str(tmp_path / "config.yaml")})}
  return start_launch(str(tmp_path / "config.yaml"), "--logs", str(tmp_path / "logs"),
                      "--grace-period", "5", *flags, "--", sys.executable,
                      str(PROGRAMS / "elastic.py"), env=env)


@pytest.mark.timeout(480)  # Past its own 420 s bound, so that bound's message is the one seen.
@pytest.mark.parametrize("loop", [False, True], ids=["fit", "training_loop"])
def test_a_worker_gone_for_good_leaves_two_that_finish_with_one_devices_weights(tmp_path, loop):
  """Under tfdist.fit with a restart: it fails at epoch 2, and again at once when restarted;
  under TrainingLoop with none: it is dropped at its first failure."""
  restarts = "0" if loop else "1"
  launcher = _launch(tmp_path, "--max-restarts", restarts, "--min-workers", "2", loop=loop,
                     board=not loop)
  output = finish(launcher, 420, [])
  assert launcher.returncode == 0, output[-4000:]
  said = "\n".join(line for line in output.splitlines() if line.startswith("[tfdist launch]"))
  assert output.count("worker-2 failed first (exit code 1): the root cause") == \
      (1 if loop else 2), said
  if not loop:  # The restart: `sys.exit(1)` after `import tfdist`, named at once.
    assert "its host's data is gone" in output
  assert ("worker-2 failed with no restarts left: going on without it, 2 worker(s) "
          "(--min-workers 2)") in output
  assert "the plan again: worker-0, worker-1 (without worker-2)" in output
  # Resumed from the backup of epoch 2's end (1-based), that epoch redone, none before it.
  resumed = "epoch 3, step 12" if loop else "epoch 3 of 4"
  assert f"[worker-0] tfdist: resuming at {resumed} from" in output, output[-4000:]
  begins = re.findall(r"^EPOCH_BEGIN (\d)", (tmp_path / "logs" / "worker-0.log").read_text(),
                      re.M)
  assert begins == ["0", "1", "2", "2", "3"], begins
  if not loop:  # The script loads its own file by path: the members reach it there too.
    log = (tmp_path / "logs" / "worker-1.log").read_text()
    assert log.count(f"tfdist: {tmp_path / 'config.yaml'} read as the launcher's current "
                     "members: ") == 1, log[-3000:]
  result = next(line for line in output.splitlines() if "RESULT " in line)
  got = json.loads(result.split("RESULT ", 1)[1])
  for g, w in zip(got, elastic.train_plain(), strict=True):
    np.testing.assert_allclose(g, w, atol=1e-5)
  if not loop:  # TensorBoard's own reader: the workers of each start, over time.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    (launcher_dir,) = (tmp_path / "board").glob("*/launcher")
    events = EventAccumulator(str(launcher_dir))
    events.Reload()
    assert [e.value for e in events.Scalars("launcher/workers")] == [3, 3, 2]


def test_below_the_minimum_the_launch_fails_naming_the_workers_lost(tmp_path):
  launcher = _launch(tmp_path, "--min-workers", "3", gone_at=0)
  output = finish(launcher, 240, [])
  assert launcher.returncode == 1, output[-4000:]
  assert ("worker-2 lost: 2 worker(s) remain, fewer than --min-workers 3; exit code 1"
          in output), output[-3000:]


@pytest.mark.parametrize("flags,message", [
    (["--min-workers", "4"], "--min-workers: must be from 1 to the cluster's 3 worker(s). "
                             "Received: 4"),
    (["--min-workers", "2", "--task", "worker:0"], "--min-workers: needs --rendezvous-port on a "
                                                   "per-host launch"),
    (["--rendezvous-port", "29400"], "--rendezvous-port: is for per-host elastic launches: give "
                                     "it with --task and --min-workers, on the local backend"),
    (["--rendezvous-port", "29400", "--min-workers", "2"], "--rendezvous-port: is for per-host"),
])
def test_a_min_workers_that_cannot_apply_is_refused_in_one_line(tmp_path, flags, message):
  launcher = _launch(tmp_path, *flags)
  output = finish(launcher, 60, [])
  assert launcher.returncode == 2, output[-2000:]
  assert message in output


@pytest.mark.timeout(960)  # Its launchers' own bounds (300 s each) fire first.
def test_per_host_launches_go_on_without_a_host_killed_9_and_take_it_back_in(tmp_path):
  """Three per-host launches (one a worker, as on three hosts; here all on 127.0.0.1) meeting
  at the chief's launcher (`--rendezvous-port`): worker-2's launcher and its task are killed -9
  as epoch 1 begins (a power loss, an OOM kill of the node: no word to anyone); the chief's
  launcher names it lost within the rendezvous's silence and the other two go on, never
  waiting on it; started again, it joins and is taken in as the next epoch begins; all three
  end, with plain Keras's one-device weights. (A launcher stopped with SIGTERM says it left:
  tests/test_rendezvous.py.)"""
  held = HeldPorts(4)  # Bound, never listening, until the test ends: no other test takes them.
  *ports, rendezvous = held.ports
  workers = ", ".join(f'"127.0.0.1:{p}"' for p in ports)
  path = tmp_path / "config.yaml"
  path.write_text(f"cluster: {{worker: [{workers}]}}\nstrategy: multi_worker_mirrored\n"
                  "training: {global_batch_size: 48, mixed_precision: 'off', "
                  "steps_per_execution: 1}\n"
                  f"checkpoint: {{dir: {tmp_path / 'checkpoints'}}}\n")

  def host(index, attempt=""):
    return start_launch(str(path), "--task", f"worker:{index}", "--logs",
                        str(tmp_path / f"logs-{index}{attempt}"), "--min-workers", "2",
                        "--rendezvous-port", str(rendezvous), "--max-restarts", "3",
                        "--grace-period", "15", "--", sys.executable,
                        str(PROGRAMS / "elastic.py"),
                        env={"PAUSE": "3", "TFDIST_RENDEZVOUS_SECRET": "s3cret"})
  # Restarts: its peers' collective fails first (the whole cluster restarts, or its silence
  # drops it first); the drop joins that restart (one fault, one restart), and taking it back
  # in is the second: one of --max-restarts 3 is left.
  launchers = [host(i) for i in range(3)]
  seen = [[], [], [], []]
  try:
    read_until(launchers[2], r"\[worker-2\] EPOCH_BEGIN 1", 240, seen[2])
    lost = [launchers[2].pid, *(c.pid for c in psutil.Process(launchers[2].pid).children(
        recursive=True))]
    for pid in lost:
      os.kill(pid, signal.SIGKILL)
    launchers[2].wait(timeout=10)
    # Within the silence (10 s) and the survivors' stop (their grace period, 15 s).
    read_until(launchers[0], r"worker-2 left \(its launcher went silent \(\d+ s without a "
                             r"poll: its host is lost\)\): going on without it, 2 worker\(s\)",
               60, seen[0])
    read_until(launchers[0], r"round \d+: worker-0, worker-1 \(without worker-2\)", 60, seen[0])
    back = host(2, "-again")
    launchers.append(back)
    read_until(back, r"worker-2 joined the chief's launcher at .*waiting to be taken in", 60,
               seen[3])
    read_until(launchers[0], r"worker-2 is back: taking it in as an epoch begins, 3 "
               r"worker\(s\) \(1 restart\(s\) left\)", 240, seen[0])
    outputs = [finish(launcher, 300, seen[i]) for i, launcher in enumerate(launchers) if i != 2]
  finally:
    for launcher in launchers:
      if launcher.poll() is None:
        os.killpg(launcher.pid, signal.SIGKILL)
    held.close()
  # The lost host is the root cause on every surviving terminal: no survivor blamed, no
  # survivor's collective traceback (they are in its log). Before: ~40 lines of traceback, then
  # "worker-0 failed first (exit code 1): the root cause".
  for output in outputs[:2]:
    assert "Traceback" not in output and "failed first" not in output, output[-6000:]
  said = [line for line in outputs[0].splitlines() if "the root cause" in line]
  assert all(line.startswith("[tfdist launch] worker-2 was lost (") for line in said), said
  for launcher, output in zip([launchers[0], launchers[1], back], outputs):
    assert launcher.returncode == 0, output[-4000:]
  assert "not every launcher stopped its task" not in outputs[0], outputs[0][-4000:]
  assert "[worker-2] EPOCH_BEGIN 3" in outputs[2], outputs[2][-3000:]
  # Where training resumed, as the chief's terminal says: after the loss at the start of epoch
  # 2 (of 4) at its start from the epoch-1 backup, each survivor redoing that epoch alone (no
  # step of epoch 1 again); after the take-back at the step the three agreed on.
  resumed = re.findall(r"\[worker-0\] tfdist: resuming at (epoch \d of 4(?:, step \d+)?) from",
                       outputs[0])
  assert len(resumed) == 2 and resumed[0] == "epoch 2 of 4", resumed
  for index in (0, 1):
    begins = re.findall(r"^EPOCH_BEGIN (\d)", (tmp_path / f"logs-{index}" /
                                                f"worker-{index}.log").read_text(), re.M)
    assert begins[:3] == ["0", "1", "1"], begins
  result = next(line for line in outputs[0].splitlines() if "RESULT " in line)
  got = json.loads(result.split("RESULT ", 1)[1])
  for g, w in zip(got, elastic.train_plain(), strict=True):
    np.testing.assert_allclose(g, w, atol=1e-5)


@pytest.mark.parametrize("trusting", [False, True])
def test_a_launcher_without_the_jobs_secret_is_refused_in_one_line_before_any_task(
    tmp_path, trusting):
  """The chief's rendezvous (here in the test's process) holds the job's secret; a host's
  launcher started without it ends with exit code 2 in one line naming it, having started
  nothing: refused by itself (secure by default; before, it went on unauthenticated), or,
  with --trust-network, by the chief's rendezvous."""
  from tfdist.launch.rendezvous import Host
  held = HeldPorts(3)
  *ports, port = held.ports
  held.close()
  path = tmp_path / "config.yaml"
  path.write_text("cluster: {worker: [" + ", ".join(f'"127.0.0.1:{p}"' for p in ports) +
                  "]}\nstrategy: multi_worker_mirrored\n")
  host = Host(f"127.0.0.1:{port}", ("worker-0", "worker-1"), silence=10.0, secret="s3cret")
  try:
    launcher = start_launch(str(path), "--task", "worker:1", "--logs", str(tmp_path / "logs"),
                            "--min-workers", "1", "--rendezvous-port", str(port),
                            *(["--trust-network"] if trusting else []), "--",
                            sys.executable, "-c", "raise SystemExit(9)")
    output = finish(launcher, 60, [])
  finally:
    host.close()
  assert launcher.returncode == 2, output
  said = (f"tfdist launch: TFDIST_RENDEZVOUS_SECRET: the chief's launcher at 127.0.0.1:{port} "
          "refused this launcher: TFDIST_RENDEZVOUS_SECRET must be the same on every host of "
          "the job. Received: 'unset'" if trusting else
          f"tfdist launch: TFDIST_RENDEZVOUS_SECRET: is unset: the rendezvous at "
          f"127.0.0.1:{port} would hear any caller that reaches its port (a stray process "
          "could post as a worker to shrink or stop the job). Set the same secret on every "
          "host of the job, or pass --trust-network where the network is the job's alone (as "
          "TensorFlow's own gRPC servers assume). Received: 'unset'")
  assert output.strip().splitlines()[-1] == said, output
  assert not (tmp_path / "logs").exists() or not list((tmp_path / "logs").glob("*.log"))


def test_a_slurm_launch_refuses_min_workers_saying_what_slurm_does(write_config):
  from tfdist.errors import ConfigError
  from tfdist.launch import LaunchOptions, dry_run
  path = write_config("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
  slurm = {"SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "n[1-2]",
           "SLURM_STEP_TASKS_PER_NODE": "1(x2)"}
  with pytest.raises(ConfigError, match=r"--min-workers: Slurm runs every task in one step, "
                                        r"which ends when a node fails \(srun --no-kill keeps "
                                        r"the allocation, not the step\)"):
    dry_run(str(path), ["python", "t.py"], LaunchOptions(backend="slurm", min_workers=1),
            environ=slurm)
