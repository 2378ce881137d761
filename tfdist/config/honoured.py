"""Every key of the config, for every training path: applied (and how) or refused (and why).

One table, `DECISIONS`, read by everything that needs it: `training.settings` refuses a key a
path cannot honour from it, in one line naming the key, before anything is built
(`refusal`); the docs' config reference renders it (`reference.markdown`); and the suite is
generated from it (tests/test_honoured.py): a key of the schema without a decision here, or a
decision whose checks name no existing test, fails. No TensorFlow.

```python
from tfdist.config import honoured
honoured.DECISIONS["training.zero_stage"].refused[honoured.SPLIT]   # why a split refuses it
honoured.refusal(config, (honoured.FIT, honoured.SPLIT))                 # (key, path, why) or None
```
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from tfdist.config import schema, strategies

FIT = "tfdist.fit"
LOOP = "tfdist.TrainingLoop"
PARAMETER_SERVER = "the parameter-server loop"
SPLIT = "a split model"
KERAS = "Keras's own fit after tfdist.use_keras_distribution()"
PATHS = (FIT, LOOP, PARAMETER_SERVER, SPLIT, KERAS)
"""Every way tfdist trains: its two loops, what a strategy or `parallel:` adds to them, and
Keras's own loop over a keras.distribution."""


@dataclasses.dataclass(frozen=True)
class Needs:
  """What a key needs of the run's strategy: asked for under a strategy without `feature`, the
  config's rules refuse it (`unsupported`).

  Attributes:
    feature: the `strategies.FEATURES` entry the strategy must support.
    why: the refusal's text; `{name}` is the run's strategy, `{supporting}` the strategies
      supporting `feature` ("a or b").
    values: the values that need it; None: any value but the default.
  """
  feature: str
  why: str
  values: tuple | None = None

  def __post_init__(self):
    assert self.feature in strategies.FEATURES, self.feature


@dataclasses.dataclass(frozen=True)
class Decision:
  """What every training path does with one config key.

  Attributes:
    applied: how the paths that honour it apply it (one sentence).
    refused: the paths that refuse it when it is asked for (set to other than its default),
      each with the reason (a sentence the refusal quotes).
    checked_by: the tests checking `applied` against an independent reference (plain Keras, a
      hand-written loop, a hand computation, a tool's own output), as `file.py::test_name`.
    needs: what it needs of the strategy, if anything.
  """
  applied: str
  refused: Mapping[str, str] = dataclasses.field(default_factory=dict)
  checked_by: tuple[str, ...] = ()
  needs: Needs | None = None


_KERAS_TRAINS = ("Keras's own fit takes its training settings from model.compile and "
                 "model.fit's arguments, not from the config")
_KERAS_STRATEGY = ("in one process the DeviceMesh's devices make the strategy (a task of several "
                   "workers takes its multi_worker_mirrored options)")
_DEVICES_FIRST = (" (a launched task applies them at import tfdist; "
                  "tfdist.use_keras_distribution applies them, or refuses in one line when "
                  "TensorFlow started first)")
_SPLIT_TRAINS = "a split model trains under tfdist.fit; the parameter-server loop does not split"
_LOOP_LOGS = ("the loop writes no TensorBoard files of its own: write your step's outputs with "
              "tf.summary, and profile with tf.profiler.experimental.start/stop")


def _keras(why: str = _KERAS_TRAINS) -> dict:
  return {KERAS: why}


_SHARDING = dict(  # Both ZeRO stages: what they need and where they are refused.
    needs=Needs("sharding", "needs strategy {supporting}, whose replicas each keep the "
                "optimizer's state; {name} does not"),
    refused={SPLIT: "a split model's stages hold different variables on different devices",
             **_keras()})

DECISIONS: dict[str, Decision] = {
    # -- cluster and task: the launcher's plan and the strategy (TF_CONFIG) -----------------
    "cluster.chief": Decision(
        "TF_CONFIG's chief: the parameter-server coordinator, or the first synchronous worker",
        checked_by=("test_parameter_server.py::test_cluster_converges_with_every_update_counted",
                    "test_tf_config.py::test_each_task_gets_the_whole_cluster_and_its_own_task")),
    "cluster.worker": Decision(
        "TF_CONFIG's workers: the replicas of multi_worker_mirrored, the servers a "
        "parameter-server coordinator schedules on",
        checked_by=("test_fit.py::test_multi_worker_mirrored_on_two_processes_equals_one_device",
                    "test_custom_loop.py::test_the_loop_on_two_workers_gives_one_devices_weights")),
    "cluster.ps": Decision(
        "TF_CONFIG's ps tasks: they hold the parameter-server strategy's variables",
        checked_by=("test_parameter_server.py::test_cluster_converges_with_every_update_counted",
                    "test_custom_loop.py::test_the_loop_under_parameter_server_converges")),
    "cluster.evaluator": Decision(
        "an evaluator task evaluates each checkpoint the chief writes (tfdist.fit's "
        "validation_data), outside the training cluster",
        refused={LOOP: "the evaluator is tfdist.fit's: evaluate in your own loop instead",
                 **_keras()},
        checked_by=(
            "test_parameter_server.py::test_evaluator_writes_each_checkpoints_evaluation_as_event_files",
            "test_tf_config.py::test_training_tasks_do_not_see_the_evaluator")),
    "cluster.dispatcher": Decision(
        "the tf.data service's dispatcher, started by tfdist launch (tfdist data-service) "
        "outside TF_CONFIG; its address is tfdist.data_service_address(); tfdist.fit and "
        "tfdist.TrainingLoop read the training tf.data.Dataset through it, each epoch one "
        "pass that every trainer shares (the parameter-server loop: an endless stream of "
        "shared passes)",
        refused={SPLIT: "a split model's workers take their slices of each batch themselves"},
        checked_by=("test_data_service.py::test_fit_on_two_workers_reads_each_example_once_an_epoch_through_two_data_workers",
                    "test_data_service.py::test_parameter_server_workers_share_each_pass_of_the_service",
                    "test_data_service.py::test_the_plan_runs_each_role_and_keeps_them_out_of_tf_config",
                    "test_data_service.py::test_a_tfjob_which_has_no_place_for_the_roles_refuses_them_in_one_line")),
    "cluster.data_worker": Decision(
        "the tf.data service's workers, each restarted alone at its address when it dies; "
        "placed by tfdist launch (every backend, per host) and tfdist export kubernetes",
        checked_by=("test_data_service.py::test_a_data_worker_killed_mid_epoch_is_restarted_alone_and_no_element_is_seen_twice",
                    "test_data_service.py::test_fit_goes_on_when_a_data_worker_is_killed_mid_epoch_and_trains_on_no_example_twice",
                    "test_data_service.py::test_per_host_roles_train_through_the_service_and_end_by_themselves")),
    "data_service.passes": Decision(
        "shared: each epoch one pass of the training dataset that every trainer shares (each "
        "example once an epoch over all of them); per_trainer: each trainer reads its own "
        "whole pass an epoch (each example once an epoch per trainer)",
        refused={PARAMETER_SERVER: "parameter-server workers do not step together: they read "
                                   "one endless stream of shared passes",
                 SPLIT: "a split model's workers take their slices of each batch themselves"},
        checked_by=("test_data_service.py::test_fit_on_two_workers_reads_each_example_once_an_epoch_through_two_data_workers",
                    "test_honoured.py::test_keys_that_need_another_are_refused_without_it",
                    "test_honoured.py::test_each_refusal_refuses_its_key_on_its_path_in_one_line")),
    "data_service.work_dir": Decision(
        "the dispatcher's journal (TensorFlow's fault-tolerant mode): a dispatcher killed and "
        "restarted alone by tfdist launch recovers its jobs, and training goes on",
        checked_by=("test_data_service.py::test_a_dispatcher_killed_mid_epoch_recovers_from_its_work_dir_and_training_goes_on",)),
    "task.type": Decision(
        "TF_CONFIG's task: which job this process runs",
        checked_by=("test_tf_config.py::test_each_task_gets_the_whole_cluster_and_its_own_task",
                    "test_cli.py::test_check_shows_each_tasks_tf_config_and_batch")),
    "task.index": Decision(
        "TF_CONFIG's task: its index in its job",
        checked_by=("test_tf_config.py::test_each_task_gets_the_whole_cluster_and_its_own_task",)),
    # -- strategy ---------------------------------------------------------------------------
    "strategy.name": Decision(
        "the tf.distribute strategy the path trains under (tfdist.make_strategy)",
        refused=_keras(_KERAS_STRATEGY),
        checked_by=("test_fit.py::test_single_machine_strategies_equal_one_device",
                    "test_custom_loop.py::test_the_loop_gives_one_devices_weights_losses_and_metrics")),
    "strategy.device": Decision(
        "one_device's device", refused=_keras(_KERAS_STRATEGY),
        checked_by=("test_strategies.py::test_default_and_one_device",)),
    "strategy.devices": Decision(
        "mirrored's replicas' devices", refused=_keras(_KERAS_STRATEGY),
        checked_by=("test_strategies.py::test_mirrored_config_mirrors_over_two_logical_cpus",)),
    "strategy.cross_device_ops": Decision(
        "mirrored's all-reduce (auto picks by device)", refused=_keras(_KERAS_STRATEGY),
        checked_by=("test_strategies.py::test_mirrored_cross_device_ops",)),
    "strategy.communication": Decision(
        "multi_worker_mirrored's collective implementation (ring, nccl, auto)",
        refused=_keras(_KERAS_STRATEGY),
        checked_by=("test_multi_worker.py::test_multi_worker_mirrored_all_reduce_over_two_processes",)),
    "strategy.timeout_seconds": Decision(
        "multi_worker_mirrored's collectives fail after this long instead of waiting",
        refused=_keras(_KERAS_STRATEGY)),
    "strategy.bytes_per_pack": Decision(
        "multi_worker_mirrored's gradient packs, reduced in reverse order",
        refused=_keras(_KERAS_STRATEGY),
        checked_by=("test_multi_worker.py::test_small_packs_reduced_in_reverse_order_equal_one_device",)),
    "strategy.compute_devices": Decision(
        "central_storage's computing devices", refused=_keras(_KERAS_STRATEGY),
        checked_by=("test_batch.py::test_replica_count",)),
    "strategy.parameter_device": Decision(
        "central_storage's variables' device", refused=_keras(_KERAS_STRATEGY),
        checked_by=("test_strategies.py::test_central_storage_keeps_variables_on_the_parameter_device",)),
    "strategy.max_shards": Decision(
        "parameter_server's variable partitioner (above 1 refused by the config's rules: "
        "Keras 3 optimizers cannot update sharded variables)", refused=_keras(_KERAS_STRATEGY),
        checked_by=("test_parameter_server.py::test_sharded_variables_are_refused_at_config_time",)),
    "strategy.min_shard_bytes": Decision(
        "parameter_server's variable partitioner's smallest shard: only with max_shards above "
        "1, which the config's rules refuse, so a value set is refused there too",
        refused=_keras(_KERAS_STRATEGY),
        checked_by=("test_honoured.py::test_keys_that_need_another_are_refused_without_it",)),
    # -- devices ----------------------------------------------------------------------------
    "devices.logical_cpus": Decision(
        "the CPU split into logical devices before TensorFlow starts" + _DEVICES_FIRST,
        checked_by=("test_strategies.py::test_mirrored_config_mirrors_over_two_logical_cpus",)),
    "devices.logical_gpus": Decision(
        "the first GPU split into virtual devices before TensorFlow starts" + _DEVICES_FIRST,
        checked_by=("test_devices.py::test_mirrored_over_logical_gpus_avoids_nccl",)),
    "devices.gpus_per_task": Decision(
        "the launcher's CUDA_VISIBLE_DEVICES for each local task",
        checked_by=("test_devices.py::test_each_local_task_gets_its_share_of_the_hosts_gpus",)),
    "devices.gpu_memory": Decision(
        "each GPU's memory limit or growth, before TensorFlow starts" + _DEVICES_FIRST,
        checked_by=("test_devices.py::test_the_launch_plan_gives_each_task_its_gpus_and_shared_ones_memory_growth",)),
    # -- training ---------------------------------------------------------------------------
    "training.global_batch_size": Decision(
        "the batch of numpy input and the check of a dataset's; each replica's share derived",
        refused=_keras(),
        checked_by=("test_fit.py::test_batch_size_comes_from_the_config",
                    "test_batch.py::test_global_batch_splits_over_replicas")),
    "training.per_replica_batch_size": Decision(
        "the global batch as this times the replicas", refused=_keras(),
        checked_by=("test_batch.py::test_per_replica_batch_multiplies",)),
    "training.epochs": Decision(
        "the epochs run (tfdist.fit's epochs= and loop.epochs(n) win when given)",
        refused=_keras(),
        checked_by=("test_loop_settings.py::test_the_loop_runs_the_configs_epochs_when_given_no_count",
                    "test_fit.py::test_training_actually_learns")),
    "training.steps_per_epoch": Decision(
        "an epoch's steps over one endless stream of the data (the loop's run() steps by "
        "default)", refused=_keras(),
        checked_by=("test_loop_settings.py::test_the_loop_scales_and_warms_up_the_learning_rate_as_computed_by_hand",)),
    "training.steps_per_execution": Decision(
        "steps in one call of the compiled function (Keras's steps_per_execution)",
        refused=_keras(),
        checked_by=("test_fit.py::test_single_machine_strategies_equal_one_device",)),
    "training.jit_compile": Decision(
        "the step compiled with XLA (Keras's jit_compile; the loop's step likewise); auto "
        "keeps the model's own compile(jit_compile=...), Keras's rule",
        refused={SPLIT: "the split turns XLA off itself: XLA compiles for one device and "
                        "cannot reach variables on another", **_keras()},
        # XLA's failures, TensorFlow 2.21: mirrored variables' placement; "Collectives are not
        # yet implemented for CPU devices when compiling with XLA"; under parameter servers
        # "Trying to access resource ... located in device /job:ps".
        needs=Needs("jit", "cannot be true under {name}: XLA fails there in TensorFlow 2.21 "
                    "({supporting} compile)", values=(True,)),
        checked_by=("test_loop_settings.py::test_jit_compile_compiles_the_loops_step_by_xlas_own_dump",
                    "test_fit.py::test_fit_keeps_the_jit_compile_keras_chooses_unless_the_config_sets_it")),
    "training.fused_optimizer": Decision(
        "Adam, AdamW and SGD update with TensorFlow's fused kernels", refused=_keras(),
        checked_by=("test_fused_updates.py::test_fused_update_trains_the_same_model_as_keras",)),
    "training.mixed_precision": Decision(
        "the dtype policy the model is built in (auto: measured here), outputs float32",
        refused=_keras(),
        # Under central_storage Keras's loss-scale counters are assigned per replica, which an
        # AggregatingVariable refuses.
        needs=Needs("loss_scaling", "must not be float16 under {name}: Keras's loss scaling "
                    "fails there; use bfloat16 or off", values=("float16",)),
        checked_by=("test_precision.py::test_bfloat16_model_computes_in_bfloat16_with_float32_outputs",
                    "test_fit.py::test_single_machine_strategies_equal_one_device")),
    "training.gradient_accumulation_steps": Decision(
        "the optimizer applied once every N batches (Keras's gradient_accumulation_steps)",
        refused={PARAMETER_SERVER: "Keras's accumulation fails there, and asynchronous workers "
                                   "would share one set of accumulators; use a larger batch",
                 SPLIT: "use parallel.microbatches, which sums the micro-batches' gradients "
                        "before one update", **_keras()},
        checked_by=("test_fit.py::test_single_machine_strategies_equal_one_device",
                    "test_custom_loop.py::test_the_configs_accumulation_and_precision_apply_to_the_loop")),
    "training.zero_stage": Decision(
        "each replica keeps 1/N of the optimizer's state (ZeRO stage 1), of the reduced "
        "gradients too (2, a reduce-scatter) and of the weights too (3, gathered a bucket at "
        "a time each step)",
        **_SHARDING,
        checked_by=("test_sharded_optimizer.py::test_each_device_holds_half_the_slots_and_the_weights_are_plain_keras",
                    "test_sharded_optimizer.py::test_stage_2_equals_plain_keras_and_holds_one_nth_of_the_reduced_gradients",
                    "test_sharded_optimizer.py::test_stage_3_equals_plain_keras_and_each_device_holds_one_nth")),
    "training.gradient_compression": Decision(
        "the gradients' all-reduce in bfloat16 or float16, the update in float32",
        needs=Needs("compression", "needs strategy {supporting}, not {name}: only they "
                    "all-reduce gradients"),
        refused={SPLIT: "a split model's gradients are averaged across workers in their own "
                        "dtype", **_keras()},
        checked_by=("test_compression.py::test_compressed_all_reduce_follows_plain_keras_loss_curve",)),
    "training.average_every": Decision(
        "periodic averaging: each worker steps alone, the weights averaged every N steps",
        needs=Needs("averaging", "needs strategy {supporting}, not {name}: only its workers "
                    "step alone between averages"),
        refused={SPLIT: "a split model's gradients are averaged across workers every step",
                 **_keras()},
        checked_by=(
            "test_multi_worker.py::test_periodic_averaging_every_step_equals_one_device_and_every_fourth_converges",
            "test_training_paths.py::test_the_loop_applies_periodic_averaging")),
    "training.scale_learning_rate": Decision(
        "the learning rate times the replicas", refused=_keras(),
        checked_by=("test_fit.py::test_learning_rate_is_scaled_by_replicas_and_warmed_up_over_an_epoch",
                    "test_loop_settings.py::test_the_loop_scales_and_warms_up_the_learning_rate_as_computed_by_hand")),
    "training.warmup_epochs": Decision(
        "a linear ramp of the learning rate over these epochs", refused=_keras(),
        checked_by=("test_fit.py::test_learning_rate_is_scaled_by_replicas_and_warmed_up_over_an_epoch",
                    "test_loop_settings.py::test_the_loop_scales_and_warms_up_the_learning_rate_as_computed_by_hand")),
    "training.seed": Decision(
        "Keras's set_random_seed before the model is built", refused=_keras(),
        checked_by=("test_loop_settings.py::test_the_loop_seeds_as_keras_does_so_a_seed_gives_the_hand_written_loops_weights",)),
    # -- checkpoint -------------------------------------------------------------------------
    "checkpoint.dir": Decision(
        "backups each epoch (resumed after a restart), the final model, a preemption's save",
        refused=_keras("Keras's own fit saves with its own callbacks (BackupAndRestore, "
                       "ModelCheckpoint)"),
        checked_by=("test_fault_tolerance.py::test_a_cluster_killed_9_resumes_at_its_newest_backup_with_uninterrupted_weights",
                    "test_custom_loop.py::test_a_cluster_restarted_after_a_killed_worker_resumes_to_the_same_weights")),
    "checkpoint.max_to_keep": Decision(
        "the epoch checkpoints kept in checkpoint.dir",
        refused=_keras("Keras's own fit saves with its own callbacks"),
        checked_by=("test_honoured.py::test_max_to_keep_keeps_that_many_of_the_newest_checkpoints",)),
    "checkpoint.preemption_signal": Decision(
        "a second notice signal beside SIGTERM: every worker saves at one step and exits 42",
        refused=_keras("Keras's own fit saves with its own callbacks"),
        checked_by=("test_preemption.py::test_the_configs_preemption_signal_is_forwarded_and_max_restarts_resumes_after_42",)),
    "checkpoint.backup_every_steps": Decision(
        "each task's backup also every this many steps, its variables copied at the step and "
        "written in the background (the loop: TensorFlow's asynchronous checkpoint)",
        refused={PARAMETER_SERVER: "its workers update asynchronously, so no step's state is "
                                   "whole: it backs up at epoch ends",
                 **_keras("Keras's own fit saves with its own callbacks (BackupAndRestore's "
                          "save_freq)")},
        checked_by=("test_fault_tolerance.py::test_a_cluster_killed_9_resumes_at_its_newest_backup_with_uninterrupted_weights",
                    "test_fault_tolerance.py::test_a_step_backup_is_written_in_the_background_and_loads_as_keras_saved_it",
                    "test_custom_loop.py::test_a_cluster_restarted_after_a_killed_worker_resumes_to_the_same_weights")),
    "checkpoint.backup_budget": Decision(
        "a step backup due is skipped while the last cost more than this share of the time "
        "since it began (its copy and its write; the loop: what the steps waited); every "
        "worker votes under multi_worker_mirrored",
        refused={PARAMETER_SERVER: "it backs up at epoch ends only",
                 **_keras("Keras's own fit saves with its own callbacks")},
        checked_by=("test_step_backups.py::test_a_backup_due_is_skipped_while_the_last_costs_more_than_the_budget_allows",
                    "test_step_backups.py::test_the_cadence_skips_a_due_backup_while_the_last_costs_over_its_share",
                    "test_step_backups.py::test_multi_worker_backups_are_taken_at_the_same_steps_only_when_every_worker_can_afford_them")),
    # -- tensorboard ------------------------------------------------------------------------
    "tensorboard.log_dir": Decision(
        "the chief's curves, each task's throughput and step times, the launcher's events",
        refused={LOOP: _LOOP_LOGS, **_keras("Keras's own fit logs with "
                                            "keras.callbacks.TensorBoard")},
        checked_by=("test_monitoring.py::test_the_chiefs_curves_are_written_once_and_other_tasks_keep_their_own",)),
    "tensorboard.update_freq": Decision(
        "scalars every epoch or every batch",
        refused={LOOP: _LOOP_LOGS, **_keras("Keras's own fit logs with "
                                            "keras.callbacks.TensorBoard")},
        checked_by=("test_monitoring.py::test_the_chiefs_curves_are_written_once_and_other_tasks_keep_their_own",)),
    "tensorboard.profile_batches": Decision(
        "the profiler over these batches",
        refused={LOOP: _LOOP_LOGS,
                 **_keras("Keras's own fit logs with keras.callbacks.TensorBoard")},
        checked_by=("test_monitoring.py::test_a_profile_is_written_for_the_configured_batches_on_the_chief",)),
    "tensorboard.profile_every_task": Decision(
        "every task profiles, each into its own directory",
        refused={LOOP: _LOOP_LOGS,
                 **_keras("Keras's own fit logs with keras.callbacks.TensorBoard")}),
    # -- parallel ---------------------------------------------------------------------------
    "parallel.stages": Decision(
        "the model split over this process's devices, stage by stage",
        needs=Needs("split", "needs strategy {supporting}, not {name}: a strategy over several "
                    "local devices mirrors every variable onto each, undoing the split"),
        refused={LOOP: "a user's own step runs whole models; split with tfdist.fit, or call "
                       "tfdist.parallel.split on the model and train it with model.fit",
                 PARAMETER_SERVER: "a split model trains under default or "
                                   "multi_worker_mirrored",
                 **_keras("use keras.distribution.ModelParallel's layout map")},
        checked_by=("test_parallel.py::test_a_split_model_trains_and_predicts_as_the_unsplit_one",)),
    "parallel.devices": Decision(
        "the stages' devices", refused={LOOP: _SPLIT_TRAINS, PARAMETER_SERVER: _SPLIT_TRAINS,
                                        **_keras("use keras.distribution.ModelParallel")},
        checked_by=("test_parallel.py::test_variables_and_optimizer_slots_live_on_their_stages_device",)),
    "parallel.microbatches": Decision(
        "each batch run as a pipeline of micro-batches (GPipe)",
        refused={LOOP: _SPLIT_TRAINS, PARAMETER_SERVER: _SPLIT_TRAINS,
                 **_keras("use keras.distribution.ModelParallel")},
        checked_by=("test_parallel.py::test_a_split_model_trains_and_predicts_as_the_unsplit_one",)),
    "parallel.recompute": Decision(
        "each layer's activations recomputed in the backward pass",
        refused={LOOP: _SPLIT_TRAINS, PARAMETER_SERVER: _SPLIT_TRAINS,
                 **_keras("use keras.distribution.ModelParallel")},
        checked_by=("test_parallel.py::test_recomputed_activations_train_as_the_unsplit_model",)),
}
"""Every key of the schema (`tfdist.config.reference.rows`), with what each path does."""


def value(config: schema.Config, key: str) -> Any:
  """The value of dotted `key` in `config` (a strategy option not of its strategy: its
  default)."""
  section, name = key.split(".", 1)
  if section == "strategy" and name != "name":
    return getattr(config.strategy.options, name, default(key))
  holder = getattr(config, section)
  return None if holder is None else getattr(holder, name)


def default(key: str) -> Any:
  """The schema's default of dotted `key`."""
  section, name = key.split(".", 1)
  if section == "strategy":
    if name == "name":
      return schema.StrategyConfig.name
    for kind in strategies.KINDS.values():
      for field in dataclasses.fields(kind.options):
        if field.name == name:
          return field.default
  if section == "task":
    return None
  field = next(f for f in dataclasses.fields(schema.SECTIONS[section]) if f.name == name)
  return field.default


def asked(config: schema.Config, key: str) -> bool:
  """Whether `config` sets `key` to other than its default."""
  return value(config, key) != default(key)


def refusal(config: schema.Config, paths: tuple[str, ...],
            keys: tuple[str, ...] | None = None) -> tuple[str, str, str] | None:
  """The first (key, path, why) of `config` that one of `paths` refuses, or None. Pure.

  Args:
    config: the run's config.
    paths: the paths the run takes (`training.settings.paths_of`).
    keys: the keys to look at; default every key.
  """
  for key in keys or DECISIONS:
    refused = DECISIONS[key].refused
    for path in paths:
      if path in refused and asked(config, key):
        return key, path, refused[path]
  return None


def unsupported(config: schema.Config) -> tuple[str, str] | None:
  """The first (key, why) of `config` asking for what its strategy does not support, or None.
  Pure.

  Args:
    config: a loaded config with its strategy.

  Returns:
    The key and the refusal's text (`Needs.why`, filled in), or None.
  """
  kind = strategies.kind(config.strategy.name)
  for key, decision in DECISIONS.items():
    needs = decision.needs
    if needs is None or needs.feature in kind.supports or not asked(config, key):
      continue
    if needs.values is None or value(config, key) in needs.values:
      return key, needs.why.format(name=kind.name,
                                   supporting=" or ".join(strategies.supporting(needs.feature)))
  return None


def shown(value) -> str:
  """A config value as YAML writes it: `true`, `float16`."""
  return str(value).lower() if isinstance(value, bool) else str(value)


def summary(key: str) -> str:
  """One line for the config reference: how it is applied, the strategies it needs and the
  paths refusing it."""
  decision = DECISIONS[key]
  parts = [f"refused by {path}: {why}" for path, why in decision.refused.items()]
  if decision.needs:
    values = " or ".join(map(shown, decision.needs.values or ()))
    parts.insert(0, f"{values or 'set'}: strategy "
                    f"{' or '.join(strategies.supporting(decision.needs.feature))} only")
  return decision.applied + (f" ({'; '.join(parts)})" if parts else "")
