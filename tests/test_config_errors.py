"""Every bad config gets one line naming the file, the key path, the rule and what was received.

The table is the contract: each message is exactly what a user sees.
"""

import subprocess
import sys

import pytest

from tfdist import ConfigError, load_config
from tests.conftest import REPO

MWMS_HOSTS = 'cluster: {worker: ["127.0.0.1:2001", "127.0.0.1:2002"]}\n'
PS_HOSTS = ('cluster: {chief: ["127.0.0.1:2000"], worker: ["127.0.0.1:2001"], '
            'ps: ["127.0.0.1:2002"]}\n')

# (id, YAML text, TF_CONFIG or None, --task or None, expected message; {f} is the file's path)
BAD_CONFIGS = [
    ("not_a_mapping", "- worker\n", None, None,
     "{f}: must be a mapping of sections (cluster, task, strategy, ...). Received: ['worker']"),
    ("empty_file", "", None, None,
     "{f}: is empty; give at least a strategy or a cluster."),
    ("yaml_syntax", "cluster: [\n", None, None,
     "{f}: line 2: is not valid YAML (expected the node content, but found '<stream end>')."),
    ("yaml_object_tag", "strategy: !!python/object/apply:os.system ['echo hi']\n", None, None,
     "{f}: line 1: uses a YAML tag that constructs an object; tfdist reads plain YAML only. "
     "Received: \"could not determine a constructor for the tag "
     "'tag:yaml.org,2002:python/object/apply:os.system'\""),
    ("unknown_section", "strategies: mirrored\n", None, None,
     "{f}: strategies: unknown section; the sections are: cluster, task, strategy, devices, "
     "training, checkpoint, tensorboard, parallel, data_service. Received: 'strategies'"),
    ("parallel_bad_stages", "parallel: {stages: halves}\n", None, None,
     "{f}: parallel.stages: must be \"balanced\", a list of stages (lists of layer names or "
     "indices) or a map of layer names to devices. Received: 'halves'"),
    ("parallel_under_mirrored", "strategy: mirrored\nparallel: {stages: balanced}\n", None, None,
     "{f}: parallel.stages: needs strategy default or multi_worker_mirrored, not mirrored: a "
     "strategy over several local devices mirrors every variable onto each, undoing the split. "
     "Received: 'balanced'"),
    ("unknown_training_key", "training: {epoch: 3}\n", None, None,
     "{f}: training.epoch: unknown key; the keys here are: global_batch_size, "
     "per_replica_batch_size, epochs, steps_per_epoch, steps_per_execution, jit_compile, "
     "fused_optimizer, mixed_precision, gradient_accumulation_steps, zero_stage, "
     "gradient_compression, average_every, scale_learning_rate, warmup_epochs, seed. "
     "Received: 'epoch'"),
    ("unknown_job", "cluster: {master: ['127.0.0.1:2000']}\n", None, None,
     "{f}: cluster.master: unknown job; the jobs are: chief, worker, ps, evaluator, dispatcher, "
     "data_worker. Received: 'master'"),
    ("two_chiefs", "cluster: {chief: ['127.0.0.1:2000', '127.0.0.1:2001']}\n", None, None,
     "{f}: cluster.chief: a cluster has at most one chief. Received: 2"),
    ("two_evaluators", "cluster: {worker: 1, evaluator: 2}\n", None, None,
     "{f}: cluster.evaluator: a cluster has at most one evaluator. Received: 2"),
    ("duplicate_address", "cluster: {worker: ['127.0.0.1:2000'], ps: ['127.0.0.1:2000']}\n",
     None, None,
     "{f}: cluster.ps[0]: must differ from every other address; cluster.worker[0] has it too. "
     "Received: '127.0.0.1:2000'"),
    ("address_without_port", "cluster: {worker: ['127.0.0.1:2000', 'localhost']}\n", None, None,
     '{f}: cluster.worker[1]: must be "host:port" with a port from 1 to 65535. '
     "Received: 'localhost'"),
    ("port_out_of_range", "cluster: {worker: ['127.0.0.1:70000']}\n", None, None,
     '{f}: cluster.worker[0]: must be "host:port" with a port from 1 to 65535. '
     "Received: '127.0.0.1:70000'"),
    ("address_not_a_string", "cluster: {worker: [2000]}\n", None, None,
     '{f}: cluster.worker[0]: must be "host:port" with a port from 1 to 65535. Received: 2000'),
    ("sparse_dict_tasks", "cluster: {worker: {1: '127.0.0.1:2000'}}\n", None, None,
     '{f}: cluster.worker: must be a count of tasks or a list of "host:port" addresses. '
     "Received: {1: '127.0.0.1:2000'}"),
    ("negative_count", "cluster: {worker: -1}\n", None, None,
     "{f}: cluster.worker: a count must be 0 or greater. Received: -1"),
    ("counts_and_addresses", "cluster: {worker: 2, ps: ['127.0.0.1:2000']}\n", None, None,
     "{f}: cluster: must give every job as counts (a cluster on this machine) or every job as "
     "address lists (a real cluster), not both. Received: {'worker': 2, 'ps': ['127.0.0.1:2000']}"),
    ("task_type_missing_from_cluster", MWMS_HOSTS + "task: {type: chief, index: 0}\n", None, None,
     "{f}: task.type: must be a job of the cluster (worker). Received: 'chief'"),
    ("task_index_out_of_range", MWMS_HOSTS + "task: {type: worker, index: 2}\n", None, None,
     "{f}: task.index: must be from 0 to 1: the cluster has 2 worker task(s). Received: 2"),
    ("task_index_string", MWMS_HOSTS + "task: {type: worker, index: '1'}\n", None, None,
     "{f}: task.index: must be an integer. Received: '1'"),
    ("task_without_cluster", "task: {type: worker, index: 0}\n", None, None,
     "{f}: task: is set but the cluster is empty; TensorFlow would silently train on one "
     "worker: give the cluster too. Received: 'worker:0'"),
    ("unknown_strategy", "strategy: horovod\n", None, None,
     "{f}: strategy.name: must be one of default, one_device, mirrored, multi_worker_mirrored, "
     "central_storage, parameter_server. Received: 'horovod'"),
    ("strategy_yaml_boolean", "strategy: off\n", None, None,
     "{f}: strategy.name: must be one of default, one_device, mirrored, multi_worker_mirrored, "
     "central_storage, parameter_server; YAML reads unquoted yes/no/on/off/true/false as a "
     "boolean: quote the value. Received: False"),
    ("option_yaml_boolean", "training: {mixed_precision: on}\n", None, None,
     "{f}: training.mixed_precision: must be one of off, auto, bfloat16, float16; YAML reads "
     "unquoted yes/no/on/off/true/false as a boolean: quote the value. Received: True"),
    ("empty_job_list", "cluster: {worker: []}\nstrategy: multi_worker_mirrored\n", None, None,
     '{f}: cluster.worker: must list at least one "host:port" address; leave the job out for '
     "none. Received: []"),
    ("option_of_another_strategy", "strategy: {name: mirrored, communication: ring}\n", None, None,
     "{f}: strategy.communication: is not an option of mirrored; its options are: devices, "
     "cross_device_ops. Received: 'ring'"),
    ("bad_cross_device_ops", "strategy: {name: mirrored, cross_device_ops: ring}\n", None, None,
     "{f}: strategy.cross_device_ops: must be one of auto, nccl, hierarchical_copy, "
     "reduction_to_one. Received: 'ring'"),
    ("bad_communication", "strategy: {name: multi_worker_mirrored, communication: mpi}\n",
     None, None,
     "{f}: strategy.communication: must be one of auto, ring, nccl. Received: 'mpi'"),
    ("negative_timeout", "strategy: {name: multi_worker_mirrored, timeout_seconds: -5}\n",
     None, None, "{f}: strategy.timeout_seconds: must be greater than 0. Received: -5.0"),
    ("ps_without_ps_tasks",
     "cluster: {chief: ['127.0.0.1:2000'], worker: ['127.0.0.1:2001']}\n"
     "strategy: parameter_server\n", None, None,
     "{f}: cluster.ps: parameter_server needs at least one ps task. Received: 0"),
    ("ps_without_workers",
     "cluster: {chief: ['127.0.0.1:2000'], ps: ['127.0.0.1:2001']}\n"
     "strategy: parameter_server\n", None, None,
     "{f}: cluster.worker: parameter_server needs at least one worker task. Received: 0"),
    ("ps_without_chief", "cluster: {worker: 2, ps: 1}\nstrategy: parameter_server\n", None, None,
     "{f}: cluster.chief: parameter_server needs one chief task, the coordinator that runs the "
     "training script. Received: 0"),
    # Before, `tfdist check` passed it and training refused it (issue 86).
    ("stage3_accumulation", "strategy: mirrored\ntraining: {zero_stage: 3, "
     "gradient_accumulation_steps: 2}\n", None, None, "{f}: training.zero_stage: stage 3 cannot "
     "be combined with training.gradient_accumulation_steps above 1: gradient accumulation "
     "keeps a whole accumulator of every weight on every replica. Received: 3"),
    ("ps_sharding", PS_HOSTS + "strategy: {name: parameter_server, max_shards: 2}\n", None, None,
     "{f}: strategy.max_shards: must be 1: Keras 3 optimizers cannot update sharded variables "
     "('ShardedVariable' object has no attribute 'handle'). Received: 2"),
    ("mwms_with_ps", PS_HOSTS + "strategy: multi_worker_mirrored\n", None, None,
     "{f}: cluster.ps: multi_worker_mirrored takes no ps tasks (TensorFlow waits forever for "
     "them); remove cluster.ps or use parameter_server. Received: 1"),
    ("mirrored_multi_worker", MWMS_HOSTS + "strategy: mirrored\n", None, None,
     "{f}: strategy.name: mirrored runs on one machine; a cluster of 2 training tasks needs "
     "multi_worker_mirrored (or parameter_server with ps tasks). Received: 'mirrored'"),
    ("central_storage_multi_worker", MWMS_HOSTS + "strategy: central_storage\n", None, None,
     "{f}: strategy.name: central_storage runs on one machine; a cluster of 2 training tasks "
     "needs multi_worker_mirrored (or parameter_server with ps tasks). "
     "Received: 'central_storage'"),
    ("both_batch_sizes", "training: {global_batch_size: 64, per_replica_batch_size: 32}\n",
     None, None,
     "{f}: training.per_replica_batch_size: give global_batch_size or per_replica_batch_size, "
     "not both. Received: 32"),
    ("jit_under_mirrored", "strategy: mirrored\ntraining: {jit_compile: true}\n", None, None,
     "{f}: training.jit_compile: cannot be true under mirrored: XLA fails there in TensorFlow "
     "2.21 (default or one_device compile). Received: True"),
    ("jit_under_parameter_server",
     PS_HOSTS + "strategy: parameter_server\ntraining: {jit_compile: true}\n", None, None,
     "{f}: training.jit_compile: cannot be true under parameter_server: XLA fails there in "
     "TensorFlow 2.21 (default or one_device compile). Received: True"),
    ("float16_under_central_storage",
     "strategy: central_storage\ntraining: {mixed_precision: float16}\n", None, None,
     "{f}: training.mixed_precision: must not be float16 under central_storage: Keras's loss "
     "scaling fails there; use bfloat16 or off. Received: 'float16'"),
    ("preemption_signal_without_checkpoints", "checkpoint: {preemption_signal: SIGUSR1}\n",
     None, None, "{f}: checkpoint.preemption_signal: needs checkpoint.dir: a preemption notice "
     "saves each task's backup there. Received: 'SIGUSR1'"),
    ("average_every_with_compression", "cluster: {worker: 2}\ntraining: {average_every: 4, "
     "gradient_compression: bfloat16}\n", None, None,
     "{f}: training.gradient_compression: must be none with average_every: periodic averaging "
     "all-reduces no gradients. Received: 'bfloat16'"),
    ("zero_batch", "training: {global_batch_size: 0}\n", None, None,
     "{f}: training.global_batch_size: must be greater than 0. Received: 0"),
    ("boolean_as_integer", "training: {epochs: true}\n", None, None,
     "{f}: training.epochs: must be an integer. Received: True"),
    ("negative_logical_cpus", "devices: {logical_cpus: -2}\n", None, None,
     "{f}: devices.logical_cpus: must be 0 or greater. Received: -2"),
    ("bad_profile_batches", "tensorboard: {profile_batches: [5, 2]}\n", None, None,
     "{f}: tensorboard.profile_batches: must be empty or two batch numbers [first, last], "
     "1 <= first <= last. Received: (5, 2)"),
    ("empty_tf_config", "strategy: default\n", "", None,
     "TF_CONFIG: is set but empty; unset it or give a JSON object with cluster and task. "
     "Received: ''"),
    ("tf_config_not_json", "strategy: default\n", "{cluster:", None,
     "TF_CONFIG: must be JSON (Expecting property name enclosed in double quotes at line 1 "
     "column 2). Received: '{cluster:'"),
    ("tf_config_counts_differ", "cluster: {worker: 2}\n",
     '{"cluster": {"worker": ["127.0.0.1:2001", "127.0.0.1:2002", "127.0.0.1:2003"]}, '
     '"task": {"type": "worker", "index": 0}}', None,
     "TF_CONFIG: cluster: must have the job sizes of {f} ({'worker': 2}). "
     "Received: {'worker': 3}"),
    ("tf_config_unknown_key", "strategy: default\n", '{"cluster": {}, "tasks": {}}', None,
     "TF_CONFIG: tasks: unknown key; TF_CONFIG holds cluster and task. Received: 'tasks'"),
    ("task_flag_malformed", MWMS_HOSTS, None, "worker1",
     "--task: must be TYPE:INDEX with TYPE one of chief, worker, ps, evaluator, dispatcher, "
     "data_worker. Received: 'worker1'"),
    ("task_flag_out_of_range", MWMS_HOSTS, None, "worker:5",
     "{f}: task.index: must be from 0 to 1: the cluster has 2 worker task(s). Received: 5"),
]


@pytest.mark.parametrize("text,tf_config,task,expected",
                         [case[1:] for case in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_names_file_key_rule_and_value(write_config, text, tf_config, task, expected):
  path = write_config(text)
  environ = {} if tf_config is None else {"TF_CONFIG": tf_config}
  with pytest.raises(ConfigError) as raised:
    load_config(path, task=task, environ=environ)
  message = str(raised.value)
  assert message == expected.replace("{f}", str(path))
  assert "\n" not in message


def test_missing_file_is_named(tmp_path):
  with pytest.raises(ConfigError, match=r"nope\.yaml: cannot be read \(No such file or directory\)"):
    load_config(tmp_path / "nope.yaml", environ={})


FIT_READS = [c for c in BAD_CONFIGS if c[2] is None and c[3] is None]


@pytest.mark.parametrize("text,expected", [case[1::3] for case in FIT_READS],
                         ids=[c[0] for c in FIT_READS])
def test_tfdist_fit_refuses_each_bad_config_as_check_does(write_config, text, expected,
                                                          monkeypatch):
  """One home for the rules: every refusal of the table (one without TF_CONFIG or --task)
  stops `tfdist.fit` with the message `load_config` (so `tfdist check`) gives, before any
  model is built."""
  import tfdist
  for name in ("TF_CONFIG", "TFDIST_CONFIG"):
    monkeypatch.delenv(name, raising=False)
  path = write_config(text)
  with pytest.raises(ConfigError) as raised:
    tfdist.fit(lambda: pytest.fail("a model was built"), config=str(path))
  assert str(raised.value) == expected.replace("{f}", str(path))


@pytest.mark.parametrize("case_id", ["two_chiefs", "yaml_object_tag", "mwms_with_ps",
                                     "stage3_accumulation"])
def test_cli_check_fails_fast_in_one_line_with_exit_code_2(write_config, case_id):
  text = {c[0]: c[1] for c in BAD_CONFIGS}[case_id]
  path = write_config(text)
  result = subprocess.run([sys.executable, "-m", "tfdist", "check", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin"})
  assert result.returncode == 2
  assert result.stdout == ""
  assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"tfdist check: {path}: ")
  assert "Traceback" not in result.stderr
