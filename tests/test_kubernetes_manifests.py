"""Every manifest `tfdist export kubernetes` makes, validated against Kubernetes' own strict JSON
schemas (the kubernetes-validate package: 1.28 and the newest it ships), and the semantic rules
the schemas cannot see: names the API server accepts, shared storage where the config writes,
no pod deleted before the evaluator is done, no YAML anchors, no Service for the evaluator.

The TFJob itself is a custom resource: its pod templates are validated as core PodTemplates
(the TFJob CRD embeds `PodTemplateSpec`), and the whole TFJob, field by field, against the
OpenAPI models of kubeflow/training-operator release v1.9.0 (its generated SDK on PyPI,
`kubeflow-training==1.9.0`, and the Kubernetes client's models it builds on).
"""

import re

import kubernetes_validate
import pytest
import yaml

import tfdist
from tfdist.errors import ConfigError
from tfdist.job_files import kubernetes

VERSIONS = ["1.28.0", kubernetes_validate.latest_version()]
CONFIGS = {
    "mwms": "cluster: {worker: 2}\nstrategy: multi_worker_mirrored\n"
            "checkpoint: {dir: /data/run/checkpoints}\ntensorboard: {log_dir: /data/run/logs}\n",
    "ps": "cluster: {chief: 1, worker: 2, ps: 1, evaluator: 1}\nstrategy: parameter_server\n"
          "training: {steps_per_epoch: 10}\ncheckpoint: {dir: /data/ps/checkpoints}\n",
    "data_service": "cluster: {worker: 2, dispatcher: 1, data_worker: 2}\n"
                    "strategy: multi_worker_mirrored\n",
}
# The kinds that place each config's roles (the training operator's TFJob has no tf.data
# service replica types: refused, test_data_service.py).
PLACED = [(name, kind) for name in CONFIGS for kind in kubernetes.KINDS
          if not (name == "data_service" and kind == "tfjob")]
_TFJOB_REPLICA_FIELDS = {"replicas", "restartPolicy", "template"}


def export(write_config, name, kind):
  config = tfdist.load_config(write_config(CONFIGS[name]), environ={})
  return kubernetes.manifests(config, ["python", "train.py"], name="run", image="img:1",
                              namespace="ml", kind=kind, volume_claim="shared")


def core_documents(documents):
  """The documents a plain API server validates; a TFJob's pod templates as PodTemplates, a
  JobSet's jobs as Jobs."""
  for document in documents:
    if document["kind"] == "JobSet":
      for job in document["spec"]["replicatedJobs"]:
        yield {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": f"run-{job['name']}-0", "namespace": "ml"},
               "spec": job["template"]["spec"]}
      continue
    if document["kind"] != "TFJob":
      yield document
      continue
    for role, replica in document["spec"]["tfReplicaSpecs"].items():
      yield {"apiVersion": "v1", "kind": "PodTemplate",
             "metadata": {"name": f"run-{role.lower()}", "namespace": "ml"},
             "template": replica["template"]}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name,kind", PLACED)
def test_every_manifest_passes_the_strict_kubernetes_schemas(write_config, name, kind, version):
  documents = export(write_config, name, kind)
  for document in core_documents(documents):
    kubernetes_validate.validate(document, version, strict=True)


def check_fields(document, type_name, path="TFJob"):
  """Every key of `document` is a field of OpenAPI model `type_name`, recursively, and every
  leaf has the declared primitive type."""
  from kubeflow.training import models as training
  from kubernetes.client import models as core

  # The training SDK writes dict(str, T) and list[T]; the Kubernetes client Dict[str, T], List[T].
  mapping = re.fullmatch(r"(?:dict\(str, |Dict\[str, )(.+)[\)\]]", type_name)
  if mapping:
    for key, value in document.items():
      check_fields(value, mapping.group(1), f"{path}.{key}")
    return
  sequence = re.fullmatch(r"[lL]ist\[(.+)\]", type_name)
  if sequence:
    for i, value in enumerate(document):
      check_fields(value, sequence.group(1), f"{path}[{i}]")
    return
  primitives = {"str": str, "int": int, "bool": bool, "object": object}
  if type_name in primitives:
    assert isinstance(document, primitives[type_name]), f"{path}: not {type_name}"
    return
  model = getattr(training, type_name, None) or getattr(core, type_name)
  fields = {json_key: attribute for attribute, json_key in model.attribute_map.items()}
  for key, value in document.items():
    assert key in fields, f"{path}: {type_name} has no field {key!r}"
    check_fields(value, model.openapi_types[fields[key]], f"{path}.{key}")


@pytest.mark.parametrize("name", ["mwms", "ps"])
def test_the_tfjob_has_the_fields_of_training_operator_v1_9(write_config, name):
  (job,) = [d for d in export(write_config, name, "tfjob") if d["kind"] == "TFJob"]
  check_fields(job, "KubeflowOrgV1TFJob")
  assert job["apiVersion"] == "kubeflow.org/v1" and set(job["spec"]) == {"runPolicy",
                                                                         "tfReplicaSpecs"}
  assert job["spec"]["runPolicy"] == {"cleanPodPolicy": "None"}  # The evaluator finishes.
  for role, replica in job["spec"]["tfReplicaSpecs"].items():
    assert role in {"Chief", "Worker", "PS", "Evaluator"}
    assert set(replica) == _TFJOB_REPLICA_FIELDS and replica["restartPolicy"] == "OnFailure"
    assert replica["template"]["spec"]["containers"][0]["name"] == "tensorflow"


# JobSet v1alpha2's fields (kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go); the
# manifests were also checked against its CRD's OpenAPI schema, made strict (BUILD_NOTES.md).
_JOBSET_FIELDS = {
    "spec": {"replicatedJobs", "network", "successPolicy", "failurePolicy", "startupPolicy",
             "suspend", "coordinator", "managedBy", "ttlSecondsAfterFinished",
             "volumeClaimPolicies"},
    "replicatedJob": {"name", "groupName", "template", "replicas", "dependsOn"},
    "network": {"enableDNSHostnames", "subdomain", "publishNotReadyAddresses"},
    "failurePolicy": {"maxRestarts", "restartStrategy", "rules"},
    "rule": {"name", "action", "onJobFailureReasons", "onJobFailureMessagePatterns",
             "targetReplicatedJobs"},
    "successPolicy": {"operator", "targetReplicatedJobs"},
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_jobset_has_jobset_v1alpha2_fields_and_restarts_the_set_after_a_preemption(
    write_config, name):
  (jobset,) = [d for d in export(write_config, name, "jobset") if d["kind"] == "JobSet"]
  spec = jobset["spec"]
  assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
  assert set(spec) <= _JOBSET_FIELDS["spec"]
  assert set(spec["network"]) <= _JOBSET_FIELDS["network"] and spec["network"][
      "enableDNSHostnames"] is True
  assert set(spec["failurePolicy"]) <= _JOBSET_FIELDS["failurePolicy"]
  (rule,) = spec["failurePolicy"]["rules"]
  assert set(rule) <= _JOBSET_FIELDS["rule"] and rule["action"] in {
      "FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts", "RestartJob",
      "RestartJobAndIgnoreMaxRestarts"}
  assert rule["onJobFailureReasons"] == ["PodFailurePolicy"]
  config = tfdist.load_config(write_config(CONFIGS[name]), environ={})
  roles = {job["name"]: job for job in spec["replicatedJobs"]}
  assert list(roles) == [kubernetes.dns_name(job) for job in config.cluster.jobs]
  for role, job in zip(config.cluster.jobs, roles.values()):
    assert set(job) <= _JOBSET_FIELDS["replicatedJob"] and job["replicas"] == 1
    template = job["template"]["spec"]
    assert template["completions"] == template["parallelism"] == config.cluster.count(role)
    assert template["completionMode"] == "Indexed" and template["backoffLimit"] == 0
    exit_codes = template["podFailurePolicy"]["rules"][0]["onExitCodes"]
    assert exit_codes["values"] == [42] and template["template"]["spec"]["restartPolicy"] == \
        "Never"
    argv = template["template"]["spec"]["containers"][0]["command"]
    assert argv[5:8] == ["--task", f"{role}:$(TFDIST_TASK_INDEX)", "--grace-period"]
  # Every pod's address is its JobSet DNS hostname.
  (config_map,) = [d for d in export(write_config, name, "jobset") if d["kind"] == "ConfigMap"]
  addresses = yaml.safe_load(config_map["data"]["config.yaml"])["cluster"]
  assert addresses["worker"] == [f"run-worker-0-{i}.run.ml.svc:2222" for i in range(2)], \
      addresses
  if name == "ps":
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief"]}
  if name == "data_service":  # Its servers never end: the set succeeds when the trainers do.
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["worker"]}
    assert addresses["data_worker"] == [f"run-data-worker-0-{i}.run.ml.svc:2222"
                                        for i in range(2)], addresses


@pytest.mark.parametrize("kind", kubernetes.KINDS)
def test_every_pod_mounts_the_shared_volume_where_the_config_writes(write_config, kind):
  pods = 0
  for document in export(write_config, "mwms", kind):
    templates = ([r["template"] for r in document["spec"]["tfReplicaSpecs"].values()]
                 if document["kind"] == "TFJob" else
                 [r["template"]["spec"]["template"] for r in document["spec"]["replicatedJobs"]]
                 if document["kind"] == "JobSet" else
                 [document["spec"]["template"]] if document["kind"] == "StatefulSet" else [])
    pods += len(templates)
    for template in templates:
      spec = template["spec"]
      assert {"name": "tfdist-storage", "persistentVolumeClaim": {"claimName": "shared"}} \
          in spec["volumes"]
      assert {"name": "tfdist-storage", "mountPath": "/data/run"} \
          in spec["containers"][0]["volumeMounts"]
  assert pods >= 1, kind  # Every kind's pod templates were found and checked.


def test_a_config_writing_files_needs_a_volume_claim(write_config):
  config = tfdist.load_config(write_config(CONFIGS["ps"]), environ={})
  with pytest.raises(ConfigError, match=r"checkpoint.dir: would be written into each pod's own "
                     r"filesystem.*--volume-claim NAME.*Received: '/data/ps/checkpoints'$"):
    kubernetes.manifests(config, ["python", "t.py"], name="run", image="i")


def test_a_one_replica_tfjob_is_refused(write_config):
  config = tfdist.load_config(write_config("cluster: {worker: 1}\n"), environ={})
  with pytest.raises(ConfigError, match="the training operator gives a one-replica TFJob no "
                     "TF_CONFIG: use --kind statefulset"):
    kubernetes.manifests(config, ["python", "t.py"], name="run", image="i", kind="tfjob")
  kubernetes.manifests(config, ["python", "t.py"], name="run", image="i", kind="statefulset")


@pytest.mark.parametrize("stem,name", [("8gpu_run", "job-8gpu-run"), ("My Run", "my-run"),
                                       ("a" * 39 + "_b", "a" * 39), ("___", "job")])
def test_job_names_from_file_names_are_dns_1035_labels(stem, name):
  assert kubernetes.job_name(stem) == name


def test_output_has_no_yaml_anchors_and_the_evaluator_no_service(write_config):
  documents = export(write_config, "ps", "statefulset")
  assert "&id" not in kubernetes.dump(documents) and "*id" not in kubernetes.dump(documents)
  assert [d["metadata"]["name"] for d in documents if d["kind"] == "Service"] == [
      "run-chief", "run-worker", "run-ps"]
  assert list(yaml.safe_load_all(kubernetes.dump(documents))) == documents


def test_the_field_check_catches_a_misspelt_field():
  with pytest.raises(AssertionError, match=r"TFJob.spec.runPolicy: KubeflowOrgV1RunPolicy has "
                     r"no field 'cleanPodPolicies'"):
    check_fields({"spec": {"runPolicy": {"cleanPodPolicies": "None"}}}, "KubeflowOrgV1TFJob")
  pod = {"template": {"spec": {"containers": [{"name": "tensorflow", "imag": "i"}]}}}
  with pytest.raises(AssertionError, match=r"containers\[0\]: V1Container has no field 'imag'"):
    check_fields({"spec": {"tfReplicaSpecs": {"Chief": pod}}}, "KubeflowOrgV1TFJob")


@pytest.mark.parametrize("name,kind", PLACED)
def test_no_exported_pod_runs_the_rendezvous_that_needs_a_secret(write_config, name, kind):
  """A per-host launch's rendezvous (`--rendezvous-port`) is refused without
  TFDIST_RENDEZVOUS_SECRET; an exported job restarts as a whole and never starts one, so it
  carries no secret (docs/reference/limits.md)."""
  commands = [container["command"] for document in core_documents(export(write_config, name, kind))
              for spec in _pod_specs(document) for container in spec["containers"]]
  assert commands and not [c for c in commands if {"--rendezvous-port", "--min-workers"} & set(c)]


def _pod_specs(document):
  spec = document.get("spec", {})
  template = document.get("template") or spec.get("template", {})
  return [template["spec"]] if "spec" in template else []
