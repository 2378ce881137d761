"""`tfdist export slurm|kubernetes`: the generated documents' structure, the TF_CONFIG each
task or replica would see, and the generated sbatch script run end to end (Slurm itself cannot
run here: `tests/fakes/srun` starts the script's tasks on this machine with the environment
srun gives them)."""

import json
import os
import shlex
import socket
import subprocess
import sys

import pytest
import yaml

import tfdist
from tfdist import ConfigError
from tfdist.job_files import kubernetes, slurm
from tfdist.launch.backends import slurm as slurm_backend
from tfdist.launch.plan import plan_launch
from tfdist.machine.ports import HeldPorts
from tfdist.testing import forked
from tests.conftest import PROGRAMS, REPO
from tests.launching import ENV

PS_CLUSTER = "cluster: {chief: 1, worker: 2, ps: 1}\nstrategy: parameter_server\n"


def tfdist_cli(*args, env=ENV, timeout=120):
  return forked.run([sys.executable, "-m", "tfdist", *args], env=env, cwd=REPO,
                    timeout=timeout)


# -- Slurm -------------------------------------------------------------------------------------

def test_sbatch_script_asks_one_task_per_role_and_launches_each_from_slurm(write_config):
  path = write_config(PS_CLUSTER)
  script = slurm.sbatch_script(tfdist.load_config(path, environ={}), str(path),
                               ["python", "train.py", "--lr", "0.1 0.2"], job_name="run",
                               nodes=2, grpc_port=3000, gpus_per_task=1)
  directives = dict(line[len("#SBATCH --"):].partition("=")[::2]
                    for line in script.splitlines() if line.startswith("#SBATCH"))
  assert directives == {"job-name": "run", "ntasks": "4", "nodes": "2",
                        "output": "run-%j.out", "gpus-per-task": "1", "cpus-per-task": "1",
                        "requeue": "", "open-mode": "append", "signal": "TERM@90"}
  (srun,) = [line for line in script.splitlines() if line.startswith("srun ")]
  assert shlex.split(srun) == [
      "srun", "--kill-on-bad-exit=1", sys.executable, "-m", "tfdist", "launch", str(path),
      "--backend", "slurm", "--task-port", "3000", "--grace-period", "80", "--", "python",
      "train.py", "--lr", "0.1 0.2"]
  assert script.endswith('[ -f "tfdist-${SLURM_JOB_ID:-0}.exit" ] && status=$(cat '
                         '"tfdist-${SLURM_JOB_ID:-0}.exit") && rm -f "tfdist-${SLURM_JOB_ID:-0}'
                         '.exit"\n# 42: every task saved its backup after a notice; the requeued '
                         'job resumes.\n[ "$status" -eq 42 ] && scontrol requeue '
                         '"$SLURM_JOB_ID" && exit 0\nexit $status\n')


def test_export_slurm_from_the_cli_asks_the_cpus_and_launches_with_backend_slurm():
  result = tfdist_cli("export", "slurm", "configs/multi_worker_mirrored.yaml", "--cpus-per-task",
                      "4", "--gpus-per-task", "2", "--notice", "60", "--", "python", "t.py")
  assert result.returncode == 0, result.stderr
  assert "#SBATCH --cpus-per-task=4\n" in result.stdout, result.stdout
  assert "#SBATCH --gpus-per-task=2\n" in result.stdout, result.stdout
  assert "#SBATCH --signal=TERM@60\n" in result.stdout and "--grace-period 50 " in result.stdout
  assert " launch " in result.stdout and " --backend slurm " in result.stdout, result.stdout


def test_launch_slurm_is_the_old_spelling_of_backend_slurm():
  """Outside an srun task both refuse alike, naming what they lack; --slurm says its new name."""
  args = ("configs/multi_worker_mirrored.yaml", "--", "python", "t.py")
  old = tfdist_cli("launch", args[0], "--slurm", *args[1:])
  new = tfdist_cli("launch", args[0], "--backend", "slurm", *args[1:])
  env = {"SLURM_PROCID", "SLURM_NTASKS"} & set(ENV)
  assert not env, env
  assert old.returncode == new.returncode == 2, old.stderr
  assert old.stderr == "tfdist launch: --slurm is now spelled --backend slurm\n" + new.stderr
  assert "--backend slurm: needs the environment of an srun task" in new.stderr, new.stderr


def test_the_sbatch_notice_is_the_configs_preemption_signal(write_config):
  config = tfdist.load_config(write_config(
      "cluster: {worker: 2}\ncheckpoint: {dir: /shared/ck, preemption_signal: SIGUSR1}\n"),
      environ={})
  script = slurm.sbatch_script(config, "c.yaml", ["python", "t.py"], job_name="run", notice=120)
  assert "#SBATCH --signal=USR1@120\n" in script and "--grace-period 110 " in script
  bare = slurm.sbatch_script(config, "c.yaml", ["python", "t.py"], job_name="run", notice=0)
  assert "--signal" not in bare and "#SBATCH --requeue\n" in bare


def test_without_a_port_each_slurm_job_gets_its_own(write_config, monkeypatch):
  config = tfdist.load_config(write_config("cluster: {worker: 2}\n"), environ={})
  script = slurm.sbatch_script(config, "c.yaml", ["python", "t.py"], job_name="run")
  assert "--task-port" not in script
  env = {"SLURM_PROCID": "1", "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_TASKS_PER_NODE": "2"}
  ports = {slurm_backend.cluster_from_slurm(config, environ={**env, "SLURM_JOB_ID": job})
           .cluster.addresses["worker"][0] for job in ("1041", "1042")}
  assert ports == {f"n1:{slurm_backend.job_port('1041')}",
                   f"n1:{slurm_backend.job_port('1042')}"}
  assert slurm_backend.job_port("1042") - slurm_backend.job_port("1041") == 16  # 16 a node.


@pytest.mark.parametrize("hostlist,hosts", [
    ("node[9-10]", ["node9", "node10"]),
    ("gpu[098-101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),
    ("a[1,3-4],login1,b[2-3]-ib", ["a1", "a3", "a4", "login1", "b2-ib", "b3-ib"]),
    ("127.0.0.1", ["127.0.0.1"]),
])
def test_slurm_host_lists_expand_in_slurms_order(hostlist, hosts):
  assert slurm_backend.expand_hostlist(hostlist) == hosts


def test_ranks_get_the_address_of_their_own_node_when_names_do_not_sort_as_text():
  env = {"SLURM_STEP_NODELIST": "node[9-10]", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}
  for rank, (task, own) in enumerate([("worker:0", "node9:3000"), ("worker:1", "node9:3001"),
                                      ("worker:2", "node10:3000"), ("worker:3", "node10:3001")]):
    addresses, got = slurm_backend.slurm_cluster({"worker": 4},
                                                 {**env, "SLURM_PROCID": str(rank)}, 3000)
    assert str(got) == task and addresses["worker"][rank] == own


def slurm_env(monkeypatch, rank, tasks=4, nodes="node[1-2]", per_node="2(x2)"):
  for name, value in {"SLURM_PROCID": rank, "SLURM_STEP_NUM_TASKS": tasks,
                      "SLURM_STEP_NODELIST": nodes, "SLURM_STEP_TASKS_PER_NODE": per_node}.items():
    monkeypatch.setenv(name, str(value))


def test_each_srun_task_gets_its_role_and_peers_from_slurm(write_config, monkeypatch, tmp_path):
  path = write_config(PS_CLUSTER)
  config = tfdist.load_config(path, environ={})
  cluster = {"chief": ["node1:3000"], "ps": ["node1:3001"],
             "worker": ["node2:3000", "node2:3001"]}
  roles = [("chief", 0, False), ("ps", 0, True), ("worker", 0, True), ("worker", 1, True)]
  for rank, (job, index, serves) in enumerate(roles):
    slurm_env(monkeypatch, rank)
    resolved = slurm_backend.cluster_from_slurm(config, grpc_port=3000)
    (process,) = plan_launch(resolved, str(path), ["python", "t.py"], log_dir=str(tmp_path),
                             task=resolved.task).processes
    assert json.loads(dict(process.env)["TF_CONFIG"]) == {
        "cluster": cluster, "task": {"type": job, "index": index}}
    assert process.serves is serves
    assert process.argv[-5:] == (("tfdist", "cluster-server", str(path), "--task", f"{job}:{index}")
                                 if serves else ("python", "t.py"))


@pytest.mark.parametrize("env,message", [
    ({}, r"--backend slurm: needs the environment of an srun task of 4 task\(s\): SLURM_PROCID not "
         r"found in environment.*Received: 'no SLURM_PROCID'"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "3", "SLURM_STEP_NODELIST": "n1",
      "SLURM_STEP_TASKS_PER_NODE": "3"}, r"Requested 4 tasks but only 3 were assigned"),
    ({"SLURM_PROCID": "0", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_STEP_TASKS_PER_NODE": "4"},
     r"2 node\(s\) but tasks per node for 1"),
])
def test_slurm_environment_errors(write_config, monkeypatch, env, message):
  for name in ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST",
               "SLURM_STEP_TASKS_PER_NODE"):
    monkeypatch.delenv(name, raising=False)
  for name, value in env.items():
    monkeypatch.setenv(name, value)
  config = tfdist.load_config(write_config(PS_CLUSTER), environ={})
  with pytest.raises(ConfigError, match=message):
    slurm_backend.cluster_from_slurm(config)


def test_a_preempted_task_records_42_before_a_peer_that_srun_stopped(tmp_path):
  """`srun --kill-on-bad-exit` stops a task's peers once it exits 42; the batch script must
  still requeue (the exit file's first writer wins), and a failure's root cause still counts."""
  from tfdist.exit_codes import PREEMPTED
  from tfdist.exit_codes import TASK_FAILED
  from tfdist.launch.supervisor import Outcome
  env = {"SLURM_JOB_ID": "7", "SLURM_SUBMIT_DIR": str(tmp_path)}
  slurm_backend.finish(Outcome(PREEMPTED, "every task saved its backup"), env)
  slurm_backend.finish(Outcome(TASK_FAILED, "worker-1 stopped", root_cause_code=143), env)
  assert (tmp_path / "tfdist-7.exit").read_text() == f"{PREEMPTED}\n"
  env["SLURM_JOB_ID"] = "8"
  slurm_backend.finish(Outcome(0, "done"), env)
  assert not (tmp_path / "tfdist-8.exit").exists()
  slurm_backend.finish(Outcome(TASK_FAILED, "worker-1 failed", root_cause_code=7), env)
  assert (tmp_path / "tfdist-8.exit").read_text() == "7\n"


def consecutive_held_ports():
  """A free port and the next one, each held (as `HeldPorts` holds: bound with SO_REUSEADDR, not
  listening) until the script's servers bind them, so no other test takes them meanwhile."""
  while True:
    first = HeldPorts(1)
    second = socket.socket()
    second.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      second.bind(("", first.ports[0] + 1))
      return first.ports[0], (first, second)
    except OSError:  # The next port is taken: pick another first.
      first.close()
      second.close()


def test_generated_sbatch_script_trains_a_two_worker_cluster(write_config, tmp_path):
  path = write_config("cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n")
  port, held = consecutive_held_ports()
  exported = tfdist_cli("export", "slurm", str(path), "--task-port", str(port), "--",
                        sys.executable, str(PROGRAMS / "equivalence_case.py"), "plain")
  assert exported.returncode == 0, exported.stderr
  script = tmp_path / "job.sbatch"
  script.write_text(exported.stdout)
  # sbatch gives the script SLURM_NTASKS; the fake srun starts that many tasks on 127.0.0.1.
  env = {**ENV, "PATH": f"{REPO / 'tests' / 'fakes'}:{ENV['PATH']}", "SLURM_NTASKS": "2"}
  process = subprocess.Popen(["bash", str(script)], env=env, cwd=tmp_path, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             start_new_session=True)
  try:
    output, _ = process.communicate(timeout=180)
  finally:
    if process.poll() is None:
      os.killpg(process.pid, 9)
    for holder in held:
      holder.close()
  assert process.returncode == 0, output[-3000:]
  for index in (0, 1):
    assert f"127.0.0.1:{port + index}" in output
    assert f"[worker-{index}] RESULT plain " in output


# -- Kubernetes --------------------------------------------------------------------------------

def by_kind(documents, kind):
  return [d for d in documents if d["kind"] == kind]


def mounted_config(documents, tmp_path):
  """The ConfigMap's config, as a pod would see it at kubernetes.CONFIG_PATH."""
  (config_map,) = by_kind(documents, "ConfigMap")
  path = tmp_path / "config.yaml"
  path.write_text(config_map["data"]["config.yaml"])
  return path


def test_tfjob_gives_each_replica_type_its_command_and_the_operator_its_port(write_config):
  config = tfdist.load_config(write_config(PS_CLUSTER + "cluster: {chief: 1, worker: 2, ps: 1, "
                                           "evaluator: 1}\n"), environ={})
  documents = yaml.safe_load_all(kubernetes.dump(kubernetes.manifests(
      config, ["python", "train.py"], name="job", image="reg/img:1", namespace="ml",
      kind="tfjob")))
  config_map, tfjob = documents
  assert (config_map["kind"], tfjob["apiVersion"], tfjob["kind"]) == (
      "ConfigMap", "kubeflow.org/v1", "TFJob")
  specs = tfjob["spec"]["tfReplicaSpecs"]
  assert {t: s["replicas"] for t, s in specs.items()} == {
      "Chief": 1, "Worker": 2, "PS": 1, "Evaluator": 1}
  for replica_type, spec in specs.items():
    (container,) = spec["template"]["spec"]["containers"]
    assert container["name"] == "tensorflow" and container["image"] == "reg/img:1"
    assert container["ports"] == [{"name": "tfjob-port", "containerPort": 2222}]
    assert {"name": "TFDIST_CONFIG", "value": "/etc/tfdist/config.yaml"} in container["env"]
    serves = replica_type in ("Worker", "PS")
    assert container["command"] == (["python", "-m", "tfdist", "cluster-server",
                                     "/etc/tfdist/config.yaml"] if serves
                                    else ["python", "train.py"])
    (volume,) = spec["template"]["spec"]["volumes"]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]


def test_tfjob_replicas_read_their_task_from_the_operators_tf_config(write_config, tmp_path):
  config = tfdist.load_config(write_config(
      "cluster: {chief: 1, worker: 2, ps: 1, evaluator: 1}\nstrategy: parameter_server\n"),
      environ={})
  documents = kubernetes.manifests(config, ["python", "t.py"], name="job", image="i",
                                   namespace="ml", grpc_port=2000, kind="tfjob")
  path = mounted_config(documents, tmp_path)
  # The TF_CONFIG the Kubeflow training operator sets: <job>-<type>-<i>.<ns>.svc:<port>.
  cluster = {job: [f"job-{job}-{i}.ml.svc:2000" for i in range(n)]
             for job, n in {"chief": 1, "worker": 2, "ps": 1, "evaluator": 1}.items()}
  for job, n in {"chief": 1, "worker": 2, "ps": 1, "evaluator": 1}.items():
    for index in range(n):
      tf_config = json.dumps({"cluster": cluster, "task": {"type": job, "index": index}})
      seen = tfdist.load_config(environ={"TFDIST_CONFIG": str(path), "TF_CONFIG": tf_config})
      assert (seen.task.type, seen.task.index) == (job, index)
      assert seen.strategy.name == "parameter_server"
      spec = tfdist.cluster_resolver(seen).cluster_spec().as_dict()
      assert spec == {k: v for k, v in cluster.items()
                      if k != "evaluator" or job == "evaluator"}


def test_statefulsets_give_each_pod_its_tf_config(write_config, tmp_path):
  config = tfdist.load_config(write_config(PS_CLUSTER), environ={})
  documents = kubernetes.manifests(config, ["python", "train.py"], name="job", image="i",
                                   namespace="ml", kind="statefulset")
  path = mounted_config(documents, tmp_path)
  services = {s["metadata"]["name"]: s for s in by_kind(documents, "Service")}
  sets = by_kind(documents, "StatefulSet")
  counts = {"chief": 1, "worker": 2, "ps": 1}
  assert {s["metadata"]["name"]: s["spec"]["replicas"] for s in sets} == {
      f"job-{job}": n for job, n in counts.items()}
  cluster = {job: [f"job-{job}-{i}.job-{job}.ml.svc:2222" for i in range(n)]
             for job, n in counts.items()}
  for stateful_set in sets:
    spec = stateful_set["spec"]
    service = services[spec["serviceName"]]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"] == \
        spec["template"]["metadata"]["labels"]
    assert spec["podManagementPolicy"] == "Parallel"
    (container,) = spec["template"]["spec"]["containers"]
    index_env, job_id_env = container["env"]
    assert index_env["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.labels['apps.kubernetes.io/pod-index']"
    assert job_id_env == {"name": "TFDIST_JOB_ID", "value": "job"}  # The run's name (issue 40).
    job = stateful_set["metadata"]["labels"]["tfdist/role"]
    for ordinal in range(spec["replicas"]):
      # Kubernetes expands $(VAR) in a command from the container's env: here, the pod index.
      argv = [a.replace(f"$({index_env['name']})", str(ordinal)) for a in container["command"]]
      argv = [str(path) if a == kubernetes.CONFIG_PATH else a for a in argv]
      assert argv[:4] == ["python", "-m", "tfdist", "launch"]
      assert ("--keep-alive" in argv) is (job == "chief")
      result = tfdist_cli(*argv[3:argv.index("--")], "--dry-run", *argv[argv.index("--"):])
      assert result.returncode == 0, result.stderr
      tf_config = [line.split("TF_CONFIG=", 1)[1] for line in result.stdout.splitlines()
                   if "TF_CONFIG=" in line]
      assert [json.loads(t) for t in tf_config] == [
          {"cluster": cluster, "task": {"type": job, "index": ordinal}}]


@pytest.mark.parametrize("args,message", [
    (["kubernetes", "configs/multi_worker_mirrored.yaml", "--", "python", "t.py"],
     "--image: must name the container image holding tfdist and the training script."),
    (["kubernetes", "configs/multi_worker_mirrored.yaml", "--image", "i", "--name", "Bad_Name",
      "--", "python"], "--name: must be a DNS-1035 label"),
    (["kubernetes", "configs/multi_worker_mirrored.yaml", "--image", "i", "--name", "2w",
      "--volume-claim", "c", "--", "python"], "--name: must be a DNS-1035 label"),
    (["kubernetes", "configs/multi_worker_mirrored.yaml", "--image", "i", "--namespace", "My_NS",
      "--volume-claim", "c", "--", "python"], "--namespace: must be a DNS label"),
    (["kubernetes", "configs/multi_worker_mirrored.yaml", "--image", "i", "--", "python"],
     "checkpoint.dir: would be written into each pod's own filesystem, lost when a container "
     "restarts and unseen by other pods: pass --volume-claim NAME"),
    (["kubernetes", "configs/default.yaml", "--image", "i", "--", "python"],
     "cluster: must name the replicas"),
    (["nomad", "configs/default.yaml"], "engine: must be one of slurm, kubernetes. "
     "Received: 'nomad'"),
    (["slurm", "configs/multi_worker_mirrored.yaml", "--nodes", "3", "--", "python"],
     "--nodes: must be from 1 to the cluster's 2 task(s). Received: 3"),
    (["slurm", "configs/multi_worker_mirrored.yaml"], "command: must be given after --"),
])
def test_export_errors_are_one_line_with_exit_code_2(args, message):
  result = tfdist_cli("export", *args)
  assert result.returncode == 2
  assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, \
      result.stderr


def test_model_export_names_a_missing_model_and_export_serving_is_its_old_spelling():
  missing = ("tfdist model-export: MODEL: must be a .keras file, a SavedModel directory, or a "
             "directory of numbered SavedModel versions (TensorFlow Serving's layout). "
             "Received: 'no-such.keras'")
  result = tfdist_cli("model-export", "no-such.keras", "out")
  assert (result.returncode, result.stderr) == (2, missing + "\n")
  old = tfdist_cli("export", "serving", "no-such.keras", "out")
  assert (old.returncode, old.stderr) == (2, "tfdist: `tfdist export serving` is now `tfdist "
                                          "model-export`; the old name goes in the next release\n"
                                          + missing + "\n")


def test_task_port_is_the_task_servers_port_and_its_old_spellings_still_work_there():
  args = ("export", "slurm", "configs/multi_worker_mirrored.yaml")
  new = tfdist_cli(*args, "--task-port", "3000", "--", "python", "t.py")
  assert (new.returncode, new.stderr) == (0, "")
  assert "--task-port 3000 " in new.stdout
  for old_name in ("--port", "--grpc-port"):
    old = tfdist_cli(*args, old_name, "3000", "--", "python", "t.py")
    assert (old.returncode, old.stdout) == (0, new.stdout)
    assert old.stderr == (f"tfdist export: {old_name} is now spelled --task-port; the old "
                          "spelling goes in the next release\n")
  both = tfdist_cli(*args, "--port", "3000", "--task-port", "3001", "--", "python", "t.py")
  assert (both.returncode, both.stderr) == (2, "tfdist export: --task-port: must be given "
                                            "alone; --port 3000 is its old spelling. "
                                            "Received: 3001\n")
  manifests = tfdist_cli("export", "kubernetes", "configs/multi_worker_mirrored.yaml",
                         "--image", "i", "--volume-claim", "c", "--task-port", "2000", "--",
                         "python", "t.py")
  assert manifests.returncode == 0, manifests.stderr
  assert "containerPort: 2000" in manifests.stdout and "2222" not in manifests.stdout
  for old_name in ("--port", "--grpc-port"):
    launch = tfdist_cli("launch", "configs/multi_worker_mirrored.yaml", "--dry-run", old_name,
                        "3000", "--", "python", "t.py")
    assert (launch.returncode, launch.stderr.splitlines()) == (2, [
        f"tfdist launch: {old_name} is now spelled --task-port; the old spelling goes in the "
        "next release", "tfdist launch: --task-port: a local launch takes free ports, or the "
        "ports of the cluster's addresses; leave it out (it is for --backend slurm and "
        "export). Received: 3000"])


@pytest.mark.parametrize("kind, kinds", [
    ("jobset", {"ConfigMap", "JobSet"}),
    ("tfjob", {"ConfigMap", "TFJob"}),
    ("statefulset", {"ConfigMap", "Service", "StatefulSet"})])
def test_export_kubernetes_from_the_cli_makes_the_kind_asked_with_its_restarts(kind, kinds):
  """--max-restarts is the JobSet's; the other kinds refuse it, naming it."""
  result = tfdist_cli("export", "kubernetes", "configs/multi_worker_mirrored.yaml", "--image",
                      "img:1", "--volume-claim", "c", "--kind", kind, "--max-restarts", "3", "--", "python", "t.py")
  if kind != "jobset":
    assert (result.returncode, result.stderr) == (
        2, f"tfdist export: --max-restarts: is the JobSet's failurePolicy.maxRestarts; a {kind} "
        "has none (its pods restart themselves): use --kind jobset, or leave it out. Received: "
        "3\n")
    result = tfdist_cli("export", "kubernetes", "configs/multi_worker_mirrored.yaml", "--image",
                        "img:1", "--volume-claim", "c", "--kind", kind, "--", "python", "t.py")
  assert result.returncode == 0, result.stderr
  documents = list(yaml.safe_load_all(result.stdout))
  assert {d["kind"] for d in documents} == kinds
  if kind == "jobset":
    (jobset,) = [d for d in documents if d["kind"] == "JobSet"]
    assert jobset["spec"]["failurePolicy"]["maxRestarts"] == 3


def test_launch_fresh_gives_every_task_the_fresh_start():
  """`--fresh` reaches each task as TFDIST_FRESH=1 (what `tfdist.fit` reads to start over:
  tests/test_fit_reporting.py); without it no task has it."""
  args = ("launch", "configs/multi_worker_mirrored.yaml", "--dry-run")
  fresh = tfdist_cli(*args, "--fresh", "--", "python", "t.py")
  plain = tfdist_cli(*args, "--", "python", "t.py")
  assert fresh.returncode == plain.returncode == 0, fresh.stderr + plain.stderr
  assert fresh.stdout.count("TFDIST_FRESH=1\n") == 2, fresh.stdout
  assert "TFDIST_FRESH" not in plain.stdout


# -- held ports and --keep-alive ---------------------------------------------------------------

def test_held_ports_cannot_be_taken_until_released():
  held = HeldPorts(2)
  assert len(set(held.ports)) == 2
  for port in held.ports:
    with socket.socket() as other, pytest.raises(OSError):
      other.bind(("", port))
  held.close()
  for port in held.ports:
    with socket.socket() as other:
      other.bind(("", port))


def test_keep_alive_stays_up_after_success_until_sigterm(write_config, tmp_path):
  path = write_config("cluster: {worker: 1}\n")
  launcher = subprocess.Popen(
      [sys.executable, "-m", "tfdist", "launch", str(path), "--keep-alive", "--logs",
       str(tmp_path), "--", sys.executable, "-c", "print('trained')"],
      env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
      start_new_session=True)
  try:
    lines = []
    for line in launcher.stdout:
      lines.append(line)
      if "--keep-alive: staying up until stopped" in line:
        break
    assert "[worker-0] trained\n" in lines
    assert launcher.poll() is None
    launcher.terminate()
    assert launcher.wait(timeout=10) == 0
  finally:
    if launcher.poll() is None:
      os.killpg(launcher.pid, 9)
