"""Kubernetes: the manifests of a config, as a Kubeflow TFJob or as plain StatefulSets.

Both mount the config from a ConfigMap at `CONFIG_PATH` and give each replica its TF_CONFIG:
- `tfjob`: the training operator sets TF_CONFIG itself (addresses
  `<job>-<type>-<index>.<namespace>.svc:<port>`); the config holds counts and tfdist reads the
  addresses from TF_CONFIG, as under `tfdist launch`.
- `statefulset`: one headless Service and one StatefulSet per job; the ConfigMap's config
  lists every pod's DNS name, and each pod runs `tfdist launch --task TYPE:$(TFDIST_TASK_INDEX)`,
  the index coming from the pod's `apps.kubernetes.io/pod-index` label (Kubernetes >= 1.28).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import yaml

from tfdist.config.loader import CONFIG_ENV, config_to_dict
from tfdist.config.schema import Config
from tfdist.errors import ConfigError
from tfdist.launch.plan import require_command, runs_server

KINDS = ("tfjob", "statefulset")
CONFIG_DIR = "/etc/tfdist"
CONFIG_PATH = f"{CONFIG_DIR}/config.yaml"
INDEX_ENV = "TFDIST_TASK_INDEX"
_TFJOB_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def job_name(text: str) -> str:
  """`text` (a config file's stem) as a DNS label: lower case, other characters as `-`."""
  return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:40] or "tfdist"


def manifests(config: Config, command: Sequence[str], *, name: str, image: str,
              namespace: str = "default", port: int = 2222, kind: str = "tfjob") -> list[dict]:
  """The documents to `kubectl apply` for `config`'s cluster.

  Args:
    config: the validated config; its cluster gives the replica counts.
    command: the user's training command, run by the chief, the workers of a synchronous
      cluster and the evaluator (a parameter-server cluster's workers and ps run servers).
    name: the job's name, a DNS label; resources are named `<name>-...` and labelled
      `tfdist/job: <name>`.
    image: the container image holding tfdist and the training script.
    namespace: the namespace the documents go to (it is part of every address).
    port: every task's server port.
    kind: `tfjob` or `statefulset`.

  Raises:
    ConfigError: an empty cluster, no command, no image, a bad name or kind.
  """
  if kind not in KINDS:
    raise ConfigError(f"must be one of {', '.join(KINDS)}", key="--kind", received=kind)
  # Job, StatefulSet and pod names must stay DNS labels (63 characters) with their suffixes.
  if not _DNS_LABEL.match(name) or len(name) > 40:
    raise ConfigError("must be a DNS label of at most 40 characters: lower-case letters, "
                      "digits and '-'", key="--name", received=name)
  if not image:
    raise ConfigError("must name the container image holding tfdist and the training script",
                      key="--image", received=image)
  if config.cluster.is_empty:
    raise ConfigError("must name the replicas (e.g. cluster: {worker: 2})", key="cluster",
                      received={}, source=config.source)
  require_command(command, "tfdist export kubernetes")
  build = _tfjob if kind == "tfjob" else _statefulsets
  return build(config, list(command), name=name, image=image, namespace=namespace, port=port)


class _Dumper(yaml.SafeDumper):
  """Writes multi-line strings (the ConfigMap's config) as readable `|` blocks."""


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


def _pod_spec(container: dict, name: str) -> dict:
  container = {**container, "volumeMounts": [{"name": "tfdist-config", "mountPath": CONFIG_DIR}]}
  return {"containers": [container],
          "volumes": [{"name": "tfdist-config", "configMap": {"name": f"{name}-config"}}]}


def _tfjob(config, command, *, name, image, namespace, port) -> list[dict]:
  counts_only = dataclasses.replace(config.cluster, addresses=None)
  replicas = {}
  for job in config.cluster.jobs:
    argv = (["python", "-m", "tfdist", "serve", CONFIG_PATH] if runs_server(config, job)
            else command)
    container = {"name": "tensorflow",  # The name the training operator gives TF_CONFIG to.
                 "image": image, "command": argv,
                 "env": [{"name": CONFIG_ENV, "value": CONFIG_PATH}],
                 "ports": [{"name": "tfjob-port", "containerPort": port}]}
    replicas[_TFJOB_TYPES[job]] = {
        "replicas": config.cluster.count(job), "restartPolicy": "OnFailure",
        "template": {"metadata": {"labels": _labels(name, job)},
                     "spec": _pod_spec(container, name)}}
  job = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob",
         "metadata": {"name": name, "namespace": namespace, "labels": _labels(name)},
         "spec": {"runPolicy": {"cleanPodPolicy": "Running"}, "tfReplicaSpecs": replicas}}
  return [_config_map(dataclasses.replace(config, cluster=counts_only), name, namespace), job]


def pod_address(name: str, job: str, index: int, namespace: str, port: int) -> str:
  """The DNS address of a StatefulSet pod: `<pod>.<service>.<namespace>.svc:<port>`."""
  return f"{name}-{job}-{index}.{name}-{job}.{namespace}.svc:{port}"


def _statefulsets(config, command, *, name, image, namespace, port) -> list[dict]:
  cluster = config.cluster
  addresses = {job: tuple(pod_address(name, job, i, namespace, port)
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
            "fieldPath": "metadata.labels['apps.kubernetes.io/pod-index']"}}}],
        "ports": [{"name": "grpc", "containerPort": port}]}
    service = f"{name}-{job}"
    documents.append({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": service, "namespace": namespace, "labels": _labels(name, job)},
        # Headless, and published before pods are ready: peers dial each other at start-up.
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": _labels(name, job), "ports": [{"name": "grpc", "port": port}]}})
    documents.append({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": service, "namespace": namespace, "labels": _labels(name, job)},
        # Parallel: a synchronous cluster's tasks wait for each other, so none may wait to start.
        "spec": {"serviceName": service, "replicas": cluster.count(job),
                 "podManagementPolicy": "Parallel",
                 "selector": {"matchLabels": _labels(name, job)},
                 "template": {"metadata": {"labels": _labels(name, job)},
                              "spec": _pod_spec(container, name)}}})
  return documents
