"""Kubernetes: the manifests of a config, as a Kubeflow TFJob, a JobSet or plain StatefulSets.

Each mounts the config from a ConfigMap at `CONFIG_PATH` and gives each replica its TF_CONFIG:
- `tfjob`: the training operator sets TF_CONFIG itself (addresses
  `<job>-<type>-<index>.<namespace>.svc:<port>`); the config holds counts and tfdist reads the
  addresses from TF_CONFIG, as under `tfdist launch`.
- `statefulset`: one headless Service and one StatefulSet per job; the ConfigMap's config
  lists every pod's DNS name, and each pod runs `tfdist launch --task TYPE:$(TFDIST_TASK_INDEX)`,
  the index coming from the pod's `apps.kubernetes.io/pod-index` label (Kubernetes >= 1.28).
- `jobset`: one JobSet (jobset.x-k8s.io/v1alpha2, the API Kubeflow Trainer v2 builds on) with a
  replicated job per role, an Indexed Job of the role's count; the config lists each pod's DNS
  hostname (`<name>-<role>-0-<index>.<name>`), each pod runs `tfdist launch --task
  TYPE:$(TFDIST_TASK_INDEX)` with the Job's completion index. A task that saved its backup
  after a preemption notice (exit 42) or an evicted pod fails its Job (podFailurePolicy), and
  the whole set restarts without counting it; any other failure restarts the set up to
  `max_restarts` times.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from typing import Sequence

import yaml

from tfdist.config import rules
from tfdist.config.loader import CONFIG_ENV, config_to_dict
from tfdist.config.schema import Config
from tfdist.errors import ConfigError
from tfdist.exit_codes import PREEMPTED
from tfdist.launch.plan import require_command, runs_server

KINDS = ("jobset", "tfjob", "statefulset")  # The first is the default.
CONFIG_DIR = "/etc/tfdist"
CONFIG_PATH = f"{CONFIG_DIR}/config.yaml"
INDEX_ENV = "TFDIST_TASK_INDEX"
JOB_ID_ENV = "TFDIST_JOB_ID"  # Read by the launcher (launch/plan.py new_run_name).
DEFAULT_PORT = 2222
DEFAULT_NAMESPACE = "default"
_TFJOB_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}
# TFJob and Service names are DNS-1035 labels (a letter first); namespaces DNS-1123 labels.
_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
VOLUME_NAME = "tfdist-storage"


def job_name(text: str) -> str:
  """`text` (a config file's stem) as a DNS-1035 label of at most 40 characters: lower case,
  other characters as `-`, a letter first (`8gpu_run` -> `job-8gpu-run`)."""
  name = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
  name = name if name[:1].isalpha() else f"job-{name}".rstrip("-")
  return name[:40].rstrip("-")


def manifests(config: Config, command: Sequence[str], *, name: str, image: str,
              namespace: str = DEFAULT_NAMESPACE, grpc_port: int = DEFAULT_PORT, kind: str = KINDS[0],
              volume_claim: str | None = None, max_restarts: int = 0) -> list[dict]:
  """The documents to `kubectl apply` for `config`'s cluster.

  Args:
    config: the validated config; its cluster gives the replica counts.
    command: the user's training command, run by the chief, the workers of a synchronous
      cluster and the evaluator (a parameter-server cluster's workers and ps run servers).
    name: the job's name, a DNS label; resources are named `<name>-...` and labelled
      `tfdist/job: <name>`.
    image: the container image holding tfdist and the training script.
    namespace: the namespace the documents go to (it is part of every address).
    grpc_port: the port every task's TensorFlow server (gRPC) listens on.
    kind: `jobset` (the default), `tfjob` (Kubeflow training operator v1) or `statefulset`.
    volume_claim: a ReadWriteMany PersistentVolumeClaim mounted where the config's checkpoint
      and TensorBoard directories are; required when the config has either.
    max_restarts: `jobset`: restarts of the whole set after failures (preemptions and
      evictions are not counted).

  Returns:
    The documents, in the order to apply them.

  ```python
  print(dump(manifests(config, ["python", "train.py"], name="mnist", image="me/train:1",
                       kind="jobset", volume_claim="shared")))
  ```

  Raises:
    ConfigError: an empty cluster, no command, no image, a bad name, namespace or kind, a
      one-replica TFJob, files to write with no volume to keep them, or tf.data service roles
      in a TFJob (the training operator has no such replica types).
  """
  if kind == "tfjob":  # The training operator's replica types: Chief, Worker, PS, Evaluator.
    rules.refuse_data_service(config, "a TFJob (--kind tfjob)")
  if kind not in KINDS:
    raise ConfigError(f"must be one of {', '.join(KINDS)}", key="--kind", received=kind)
  # Job, StatefulSet and pod names must stay DNS labels (63 characters) with their suffixes.
  if not _DNS_1035.match(name) or len(name) > 40:
    raise ConfigError("must be a DNS-1035 label of at most 40 characters: lower-case letters, "
                      "digits and '-', starting with a letter", key="--name", received=name)
  if not _DNS_1123.match(namespace) or len(namespace) > 63:
    raise ConfigError("must be a DNS label of at most 63 characters: lower-case letters, "
                      "digits and '-'", key="--namespace", received=namespace)
  if not image:
    raise ConfigError("must name the container image holding tfdist and the training script",
                      key="--image")
  if config.cluster.is_empty:
    raise ConfigError("must name the replicas (e.g. cluster: {worker: 2})", key="cluster",
                      received={}, source=config.source)
  require_command(command, "tfdist export kubernetes")
  if kind == "tfjob" and len(config.cluster.tasks()) == 1:
    raise ConfigError("has one replica, and the training operator gives a one-replica TFJob no "
                      "TF_CONFIG: use --kind statefulset, or more tasks", key="cluster",
                      received=config.cluster.counts(), source=config.source)
  if max_restarts and kind != "jobset":
    raise ConfigError(f"is the JobSet's failurePolicy.maxRestarts; a {kind} has none (its pods "
                      "restart themselves): use --kind jobset, or leave it out",
                      key="--max-restarts", received=max_restarts)
  storage = storage_mount(config, volume_claim)
  if kind == "jobset":
    return _jobset(config, list(command), name=name, image=image, namespace=namespace,
                   grpc_port=grpc_port, storage=storage, max_restarts=max_restarts)
  build = _tfjob if kind == "tfjob" else _statefulsets
  return build(config, list(command), name=name, image=image, namespace=namespace,
               grpc_port=grpc_port, storage=storage)


def storage_mount(config: Config, volume_claim: str | None) -> dict | None:
  """Where the shared volume goes: the deepest directory holding the config's checkpoint and
  TensorBoard directories, which every pod must see (a restarted pod resumes from the backup,
  the evaluator reads the chief's checkpoints, the final model outlives the pod).

  Raises:
    ConfigError: the config writes such files and no claim is given, or they have no common
      directory but `/`.
  """
  directories = [d for d in (config.checkpoint.dir, config.tensorboard.log_dir) if d]
  if not directories:
    return None
  key = "checkpoint.dir" if config.checkpoint.dir else "tensorboard.log_dir"
  if not volume_claim:
    raise ConfigError("would be written into each pod's own filesystem, lost when a container "
                      "restarts and unseen by other pods: pass --volume-claim NAME (a "
                      "ReadWriteMany PersistentVolumeClaim, mounted there)", key=key,
                      received=directories[0], source=config.source)
  mount = posixpath.commonpath([posixpath.abspath(d) for d in directories])
  if mount == "/":
    raise ConfigError("and tensorboard.log_dir must share a directory to mount the volume at",
                      key="checkpoint.dir", received=directories, source=config.source)
  return {"claim": volume_claim, "mountPath": mount}


class _Dumper(yaml.SafeDumper):
  """Writes multi-line strings (the ConfigMap's config) as readable `|` blocks, and repeated
  values in full (no `&id001` anchors)."""

  def ignore_aliases(self, data):
    return True


_Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def dump(documents: list[dict]) -> str:
  """The documents as one multi-document YAML stream."""
  return yaml.dump_all(documents, Dumper=_Dumper, sort_keys=False)


def _labels(name: str, job: str | None = None) -> dict:
  return {"tfdist/job": name, **({"tfdist/role": job} if job else {})}


def _config_map(config: Config, name: str, namespace: str) -> dict:
  document = config_to_dict(dataclasses.replace(config, task=None))
  return {"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": f"{name}-config", "namespace": namespace,
                       "labels": _labels(name)},
          "data": {"config.yaml": yaml.safe_dump(document, sort_keys=False)}}


def _pod_spec(container: dict, name: str, storage: dict | None) -> dict:
  mounts = [{"name": "tfdist-config", "mountPath": CONFIG_DIR}]
  volumes = [{"name": "tfdist-config", "configMap": {"name": f"{name}-config"}}]
  if storage:
    mounts.append({"name": VOLUME_NAME, "mountPath": storage["mountPath"]})
    volumes.append({"name": VOLUME_NAME,
                    "persistentVolumeClaim": {"claimName": storage["claim"]}})
  return {"containers": [{**container, "volumeMounts": mounts}], "volumes": volumes}


def _tfjob(config, command, *, name, image, namespace, grpc_port, storage) -> list[dict]:
  counts_only = dataclasses.replace(config.cluster, addresses=None)
  replicas = {}
  for job in config.cluster.jobs:
    argv = (["python", "-m", "tfdist", "cluster-server", CONFIG_PATH] if runs_server(config, job)
            else command)
    container = {"name": "tensorflow",  # The name the training operator gives TF_CONFIG to.
                 "image": image, "command": argv,
                 "env": [{"name": CONFIG_ENV, "value": CONFIG_PATH}],
                 "ports": [{"name": "tfjob-port", "containerPort": grpc_port}]}
    replicas[_TFJOB_TYPES[job]] = {
        "replicas": config.cluster.count(job), "restartPolicy": "OnFailure",
        "template": {"metadata": {"labels": _labels(name, job)},
                     "spec": _pod_spec(container, name, storage)}}
  job = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob",
         "metadata": {"name": name, "namespace": namespace, "labels": _labels(name)},
         # None: no pod is deleted when the chief succeeds; the evaluator finishes its last
         # evaluation and the servers end by themselves.
         "spec": {"runPolicy": {"cleanPodPolicy": "None"}, "tfReplicaSpecs": replicas}}
  return [_config_map(dataclasses.replace(config, cluster=counts_only), name, namespace), job]


def dns_name(job: str) -> str:
  """A job's name inside Kubernetes' names, which are DNS labels: `data_worker` is
  `data-worker`."""
  return job.replace("_", "-")


def pod_address(name: str, job: str, index: int, namespace: str, grpc_port: int) -> str:
  """The DNS address of a StatefulSet pod: `<pod>.<service>.<namespace>.svc:<port>`."""
  job = dns_name(job)
  return f"{name}-{job}-{index}.{name}-{job}.{namespace}.svc:{grpc_port}"


def _statefulsets(config, command, *, name, image, namespace, grpc_port, storage) -> list[dict]:
  cluster = config.cluster
  addresses = {job: tuple(pod_address(name, job, i, namespace, grpc_port)
                          for i in range(cluster.count(job))) for job in cluster.jobs}
  documents = [_config_map(dataclasses.replace(
      config, cluster=dataclasses.replace(cluster, addresses=addresses)), name, namespace)]
  for job in cluster.jobs:
    # A StatefulSet restarts a pod that exits, even with code 0: a finished training task
    # stays up (--keep-alive) instead of training again.
    keep_alive = [] if runs_server(config, job) else ["--keep-alive"]
    argv = ["python", "-m", "tfdist", "launch", CONFIG_PATH, "--task",
            f"{job}:$({INDEX_ENV})", *keep_alive, "--", *command]
    container = {
        "name": "tfdist", "image": image, "command": argv,
        "env": [{"name": INDEX_ENV, "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}},
                {"name": JOB_ID_ENV, "value": name}],  # The run's name (launch's logs).
        "ports": [{"name": "grpc", "containerPort": grpc_port}]}
    service = f"{name}-{dns_name(job)}"
    if job != "evaluator":  # It serves nothing.
      documents.append({
          "apiVersion": "v1", "kind": "Service",
          "metadata": {"name": service, "namespace": namespace, "labels": _labels(name, job)},
          # Headless, and published before pods are ready: peers dial each other at start-up.
          "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                   "selector": _labels(name, job),
                   "ports": [{"name": "grpc", "port": grpc_port}]}})
    documents.append({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": service, "namespace": namespace, "labels": _labels(name, job)},
        # Parallel: a synchronous cluster's tasks wait for each other, so none may wait to start.
        "spec": {"serviceName": service, "replicas": cluster.count(job),
                 "podManagementPolicy": "Parallel",
                 "selector": {"matchLabels": _labels(name, job)},
                 "template": {"metadata": {"labels": _labels(name, job)},
                              "spec": _pod_spec(container, name, storage)}}})
  return documents


GRACE_SECONDS = 30
"""The pods' termination grace period; the launcher in each gives its task 5 s less to save."""


def _jobset(config, command, *, name, image, namespace, grpc_port, storage,
            max_restarts) -> list[dict]:
  cluster = config.cluster
  addresses = {job: tuple(f"{name}-{dns_name(job)}-0-{i}.{name}.{namespace}.svc:{grpc_port}"
                          for i in range(cluster.count(job))) for job in cluster.jobs}
  documents = [_config_map(dataclasses.replace(
      config, cluster=dataclasses.replace(cluster, addresses=addresses)), name, namespace)]
  replicated = []
  for job in cluster.jobs:
    argv = ["python", "-m", "tfdist", "launch", CONFIG_PATH, "--task", f"{job}:$({INDEX_ENV})",
            "--grace-period", str(GRACE_SECONDS - 5), "--", *command]
    container = {
        "name": "tfdist", "image": image, "command": argv,
        "env": [{"name": INDEX_ENV, "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
                # The run's name: the JobSet's, the same after it restarts the set.
                {"name": JOB_ID_ENV, "valueFrom": {"fieldRef": {
                    "fieldPath": "metadata.labels['jobset.sigs.k8s.io/jobset-name']"}}}],
        "ports": [{"name": "grpc", "containerPort": grpc_port}]}
    pod = {**_pod_spec(container, name, storage), "restartPolicy": "Never",
           "terminationGracePeriodSeconds": GRACE_SECONDS}
    count = cluster.count(job)
    replicated.append({"name": dns_name(job), "replicas": 1, "template": {"spec": {
        "completionMode": "Indexed", "completions": count, "parallelism": count,
        "backoffLimit": 0,
        # A preempted task (saved, exit 42) or an evicted pod fails the Job with reason
        # PodFailurePolicy: the set restarts without counting it against maxRestarts.
        "podFailurePolicy": {"rules": [
            # onPodConditions: [] -- Kubernetes 1.28's schema requires the field.
            {"action": "FailJob", "onExitCodes": {"containerName": "tfdist", "operator": "In",
                                                  "values": [PREEMPTED]},
             "onPodConditions": []},
            {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget",
                                                        "status": "True"}]}]},
        "template": {"metadata": {"labels": _labels(name, job)}, "spec": pod}}}})
  servers = [job for job in cluster.jobs if runs_server(config, job)]
  trainers = [dns_name(job) for job in cluster.jobs
              if job not in servers and job != "evaluator"]
  spec = {"network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
          "failurePolicy": {"maxRestarts": max_restarts, "rules": [
              {"name": "preempted", "action": "RestartJobSetAndIgnoreMaxRestarts",
               "onJobFailureReasons": ["PodFailurePolicy"]}]},
          "replicatedJobs": replicated}
  if servers:  # Servers never end: the set succeeds when its trainers do.
    spec["successPolicy"] = {"operator": "All", "targetReplicatedJobs": trainers}
  documents.append({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                    "metadata": {"name": name, "namespace": namespace, "labels": _labels(name)},
                    "spec": spec})
  return documents
