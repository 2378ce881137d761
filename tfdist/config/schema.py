"""The config's shape: frozen dataclasses, one per YAML section.

Every field's type and rule is declared here and nowhere else; `loader` reads these declarations
to load a YAML file strictly, and `rules` checks what spans several sections (a task against its
cluster, a strategy against its cluster). Which strategies there are, and what each supports,
is `strategies`' (it names each one's options class from here).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Literal, Mapping

JOBS = ("chief", "worker", "ps", "evaluator", "dispatcher", "data_worker")
"""The jobs of a cluster, in launch order: the four TensorFlow's multi-worker strategies know,
then the tf.data service's roles."""
DATA_SERVICE_JOBS = ("dispatcher", "data_worker")
"""The tf.data service's roles: its dispatcher and its data workers, which run the training
input's pipeline for the trainers. TensorFlow's strategies never see them (not in TF_CONFIG)."""
OWN_RESTARTS = {"dispatcher": 3, "data_worker": 3}
"""The roles that hold no training state, and the restarts each of their tasks gets of its own
(alone, its peers going on) before `--max-restarts` counts: a data worker's lost split is
the epoch's only loss, a dispatcher reads its journal (`data_service.work_dir`) back. Three:
a worker killed by a host's OOM killer or a preemption twice more than chance in one run,
each restart ~1 s forked; past it the failure is no accident."""

def rule(check: Callable[[Any], bool], text: str) -> dict:
  """Field metadata: `check(value)` must hold, else the loader reports `text`."""
  return {"rule": (check, text)}


_POSITIVE = rule(lambda v: v > 0, "must be greater than 0")
_NON_NEGATIVE = rule(lambda v: v >= 0, "must be 0 or greater")
BACKUP_EVERY_STEPS = 100
"""checkpoint.backup_every_steps's default, measured (BUILD_NOTES.md, "Step backups")."""
BACKUP_BUDGET = 0.03
"""checkpoint.backup_budget's default: step backups cost at most 3% of the training time."""
_SHARE = rule(lambda v: v is None or 0 < v < 1,
              "must be a share of the time between 0 and 1 (0.03 is 3%), or null")
_OPTIONAL_POSITIVE = rule(lambda v: v is None or v > 0, "must be greater than 0")


def _field(default, meta=None):
  return dataclasses.field(default=default, metadata=meta or {})


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
  """The tasks of a cluster, by job.

  In YAML each job is either a list of `host:port` addresses (a real cluster) or a count (a
  cluster on this machine, whose loopback ports `tfdist launch` picks); one cluster does not mix
  the two. Counts are kept for both forms.

  Attributes:
    chief: number of chief tasks (0 or 1).
    worker: number of worker tasks.
    ps: number of parameter-server tasks.
    evaluator: number of evaluator tasks (0 or 1).
    dispatcher: number of tf.data service dispatchers (0 or 1, with data workers).
    data_worker: number of tf.data service workers (with a dispatcher).
    addresses: `host:port` of each task by job, or None while the cluster is given by counts.
  """
  chief: int = 0
  worker: int = 0
  ps: int = 0
  evaluator: int = 0
  dispatcher: int = 0
  data_worker: int = 0
  addresses: Mapping[str, tuple[str, ...]] | None = None

  def count(self, job: str) -> int:
    return getattr(self, job)

  @property
  def jobs(self) -> tuple[str, ...]:
    """The jobs with at least one task, in launch order."""
    return tuple(job for job in JOBS if self.count(job))

  @property
  def training_tasks(self) -> int:
    """Tasks that run training steps synchronously: the chief and the workers."""
    return self.chief + self.worker

  @property
  def is_empty(self) -> bool:
    return not self.jobs

  @property
  def is_multi_worker(self) -> bool:
    return self.training_tasks > 1 or self.ps > 0

  @property
  def has_addresses(self) -> bool:
    return self.addresses is not None

  def tasks(self) -> list[TaskConfig]:
    """Every task of the cluster, in launch order."""
    return [TaskConfig(job, i) for job in self.jobs for i in range(self.count(job))]

  def counts(self) -> dict[str, int]:
    return {job: self.count(job) for job in self.jobs}


@dataclasses.dataclass(frozen=True)
class TaskConfig:
  """The task this process runs, as TF_CONFIG's `task`.

  Attributes:
    type: a job of the cluster: chief, worker, ps or evaluator.
    index: the task's position in its job's list, from 0.
  """
  type: str
  index: int = 0

  def __str__(self) -> str:
    return f"{self.type}:{self.index}"

  @property
  def name(self) -> str:
    """`<type>-<index>`, as logs, directories and the launcher's lines name the task."""
    return f"{self.type}-{self.index}"


@dataclasses.dataclass(frozen=True)
class DefaultOptions:
  """`default`: TensorFlow's default strategy, one device, no options."""


@dataclasses.dataclass(frozen=True)
class OneDeviceOptions:
  """`one_device` options.

  Attributes:
    device: the device to place everything on; None picks the first GPU, else the CPU.
  """
  device: str | None = None


@dataclasses.dataclass(frozen=True)
class MirroredOptions:
  """`mirrored` options: synchronous replicas on the devices of one machine.

  Attributes:
    devices: device names to mirror over; empty means every GPU, else every (logical) CPU.
    cross_device_ops: how gradients are all-reduced: auto (TensorFlow's choice), nccl,
      hierarchical_copy or reduction_to_one.
  """
  devices: tuple[str, ...] = ()
  cross_device_ops: Literal["auto", "nccl", "hierarchical_copy", "reduction_to_one"] = "auto"


@dataclasses.dataclass(frozen=True)
class MultiWorkerMirroredOptions:
  """`multi_worker_mirrored` options: synchronous replicas over the chief and the workers.

  Attributes:
    communication: collective implementation: auto, ring or nccl.
    timeout_seconds: deadline of every collective; a stopped peer is noticed after it. None
      keeps TensorFlow's (no deadline, a heartbeat notices dead peers).
    bytes_per_pack: pack gradients into chunks of this many bytes; 0 lets TensorFlow decide.
  """
  communication: Literal["auto", "ring", "nccl"] = "auto"
  timeout_seconds: float | None = _field(None, _OPTIONAL_POSITIVE)
  bytes_per_pack: int = _field(0, _NON_NEGATIVE)


@dataclasses.dataclass(frozen=True)
class CentralStorageOptions:
  """`central_storage` options: variables on one device, computation mirrored.

  Attributes:
    compute_devices: devices that compute; empty means every GPU, else every (logical) CPU.
    parameter_device: the device holding the variables; None lets TensorFlow choose (the CPU,
      or the one GPU).
  """
  compute_devices: tuple[str, ...] = ()
  parameter_device: str | None = None


@dataclasses.dataclass(frozen=True)
class ParameterServerOptions:
  """`parameter_server` options: asynchronous workers, variables on the ps tasks.

  Attributes:
    max_shards: split each large variable over at most this many ps tasks; 1 keeps variables
      whole and places them round-robin.
    min_shard_bytes: the smallest shard worth making when `max_shards` > 1.
  """
  max_shards: int = _field(1, _POSITIVE)
  min_shard_bytes: int = _field(256 << 10, _POSITIVE)


@dataclasses.dataclass(frozen=True)
class StrategyConfig:
  """Which `tf.distribute` strategy to make, and its options.

  In YAML the options sit beside the name: `strategy: {name: mirrored, cross_device_ops: nccl}`.
  A bare string (`strategy: mirrored`) takes the defaults. Without a `strategy` section the
  cluster decides: parameter_server when it has ps tasks, multi_worker_mirrored when it has
  several workers, else default.

  Attributes:
    name: a strategy's name (`tfdist.config.strategies`, where each is declared).
    options: the options dataclass of that strategy (`strategies.kind(name).options`).
  """
  name: str = "default"
  options: Any = DefaultOptions()


@dataclasses.dataclass(frozen=True)
class DevicesConfig:
  """Local device set-up, applied before TensorFlow initialises its devices.

  Attributes:
    logical_cpus: split the CPU into this many logical devices (0 or 1: leave it whole), so that
      Mirrored and CentralStorage can run on a machine without GPUs. They share the same cores:
      this is for trying code paths, not for speed. On a machine with GPUs the process then
      uses the CPU devices alone: its GPUs are hidden from it.
    logical_gpus: split the first GPU into this many virtual devices (0 or 1: leave it whole),
      so that a one-GPU user can try mirrored or a split model; each gets `gpu_memory` MiB, or
      an even share of 90% of the GPU. Mirrored's `cross_device_ops: auto` is then
      hierarchical_copy (NCCL cannot put two ranks on one GPU).
    gpus_per_task: GPUs each local task of a launch gets (`CUDA_VISIBLE_DEVICES` from its place
      on the host); None: an even share of the host's GPUs, or one shared round-robin when
      there are fewer GPUs than tasks; 0: none.
    gpu_memory: "auto" (TensorFlow's default, nearly all of each GPU; memory growth where local
      tasks share a GPU), "growth" (allocate as needed), or MiB per GPU device.
  """
  logical_cpus: int = _field(0, _NON_NEGATIVE)
  logical_gpus: int = _field(0, _NON_NEGATIVE)
  gpus_per_task: int | None = _field(None, rule(lambda v: v >= 0, "must be 0 or greater"))
  gpu_memory: int | Literal["auto", "growth"] = _field(
      "auto", rule(lambda v: isinstance(v, str) or v > 0, "must be greater than 0 (MiB)"))


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
  """Batch sizes and the speed knobs of training.

  Attributes:
    global_batch_size: examples per step over all replicas; or give `per_replica_batch_size`.
    per_replica_batch_size: examples per step on each replica; the global batch is this times
      the number of replicas.
    epochs: passes over the training data.
    steps_per_epoch: steps in one epoch; None runs each epoch to the end of the data.
    steps_per_execution: training steps run in one call of the compiled function (batch-level
      callbacks see one call); 32 measured fastest here (BUILD_NOTES.md).
    jit_compile: compile the training step with XLA. `auto` (the default) keeps what the
      model's `compile(jit_compile=...)` chose, by default Keras's own "auto": XLA on a GPU
      outside a tf.distribute strategy, off on CPUs (no gain measured there; it halves
      bfloat16), where the model supports it. `tfdist.fit` forcing it off measured 2.8x
      (float32) and 4.9x (bfloat16) slower than Keras on an H200 (BUILD_NOTES.md). The
      loop's step: XLA only when true, as a hand-written `tf.function` step.
    fused_optimizer: update with TensorFlow's fused kernels under Adam, AdamW and SGD, as
      tf.keras 2 did (the Adam update measured 3x faster here); other optimizers keep Keras's
      own update. Off by default: Adam's kernel takes 1 - beta in float32 where Keras rounds
      the float64 difference, and after 100 steps of the benchmark MLP the weights are 7e-2
      from Keras's (SGD's kernels are exact).
    mixed_precision: off, auto, bfloat16 or float16. `auto` (the default) measures the half
      type the device supports (bfloat16 on CPUs with AMX/AVX-512 BF16 and GPUs of compute
      capability >= 8, float16 with loss scaling on 7.x GPUs) against float32 on a
      representative training step, once per machine, and takes it when >= 1.1x faster
      (`tfdist.machine.speed`). Output layers stay float32. float16 is refused under
      central_storage, where Keras's loss scaling fails.
    gradient_accumulation_steps: apply the optimizer once every this many batches.
    zero_stage: the ZeRO stage (arXiv 1910.02054; DeepSpeed's `zero_optimization.stage`,
      one number here beside the other training keys) under mirrored and
      multi_worker_mirrored, each stage sharding one more thing over the N replicas: 1, the
      optimizer's state (Adam's moments take 1/N of the bytes on each replica; files stay
      whole: `tfdist.training.sharded_optimizer`); 2, also the gradients (each replica
      receives only its shard of their sum, a reduce-scatter, half an all-reduce's traffic);
      3, also the weights (each replica holds 1/N of them, gathered a bucket, about 1 MiB, at a
      time for each step, and the model `tfdist.fit` returns keeps them sharded:
      `tfdist.training.sharded_parameters`). 0 (the default) shards nothing. The weights are
      the unsharded run's at every stage. Spelled as three booleans (`shard_optimizer`,
      `shard_gradients`, `shard_parameters`) in 0.1 (read, with a notice, until 0.2).
    gradient_compression: all-reduce gradients in bfloat16 or float16 (half the bytes over the
      network; the sum is rounded to that precision, as Horovod's fp16 compression) under
      mirrored and multi_worker_mirrored; none keeps them in their own dtype. Spelled
      `strategy.gradient_compression` in 0.1 (read there, with a notice, until 0.2).
    average_every: opt-in periodic averaging (local SGD) under multi_worker_mirrored: each
      replica steps with its own gradients and the weights are averaged over all of them every
      this many steps (at the end of the call that reaches it); 0 (the default) all-reduces
      every step's gradients. Not synchronous training's arithmetic: compare the loss curves.
      Spelled `strategy.average_every` in 0.1 (read there, with a notice, until 0.2).
    scale_learning_rate: multiply the learning rate by the number of replicas.
    warmup_epochs: ramp the (scaled) learning rate up linearly over this many epochs.
    seed: seeds Python, NumPy and TensorFlow when set.
  """
  global_batch_size: int | None = _field(None, _OPTIONAL_POSITIVE)
  per_replica_batch_size: int | None = _field(None, _OPTIONAL_POSITIVE)
  epochs: int = _field(1, _POSITIVE)
  steps_per_epoch: int | None = _field(None, _OPTIONAL_POSITIVE)
  steps_per_execution: int = _field(32, _POSITIVE)
  jit_compile: bool | Literal["auto"] = "auto"
  fused_optimizer: bool = False
  mixed_precision: Literal["off", "auto", "bfloat16", "float16"] = "auto"
  gradient_accumulation_steps: int = _field(1, _POSITIVE)
  zero_stage: int = _field(0, rule(lambda v: 0 <= v <= 3, "must be 0, 1, 2 or 3"))
  gradient_compression: Literal["none", "bfloat16", "float16"] = "none"
  average_every: int = _field(0, _NON_NEGATIVE)
  scale_learning_rate: bool = False
  warmup_epochs: int = _field(0, _NON_NEGATIVE)
  seed: int | None = None


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """Where training state goes.

  Attributes:
    dir: the checkpoint directory; None writes no checkpoints and cannot resume.
    max_to_keep: how many checkpoints to keep.
    preemption_signal: the signal that, like SIGTERM, asks `tfdist.fit` to save each task's
      backup at the same step and exit with 42 ("restart me"): SIGUSR1 for Slurm's `--signal`
      before a time limit (`tfdist export slurm` asks Slurm for it). Needs `dir`.
    backup_every_steps: each task's backup also every this many steps within an epoch
      (`tfdist.fit`, `TrainingLoop`), written in the background from a copy (the steps go on),
      so a task killed without notice redoes at most this many steps; 0 backs up at epoch ends
      only. Needs `dir`.
    backup_budget: the largest share of the training time step backups may cost: a backup due
      at a multiple of `backup_every_steps` is skipped while the last one cost more than this
      share of the time since it began (said once), so a model with short steps backs up less
      often; null takes every multiple whatever it costs.
  """
  dir: str | None = None
  max_to_keep: int = _field(3, _POSITIVE)
  preemption_signal: Literal["SIGTERM", "SIGUSR1", "SIGUSR2"] = "SIGTERM"
  backup_every_steps: int = _field(BACKUP_EVERY_STEPS, _NON_NEGATIVE)
  backup_budget: float | None = _field(BACKUP_BUDGET, _SHARE)


@dataclasses.dataclass(frozen=True)
class TensorBoardConfig:
  """TensorBoard logging (`tfdist.monitoring.tensorboard`).

  Attributes:
    log_dir: where event files go, one directory per run; None writes none.
    update_freq: write scalars every `epoch` or every `batch`.
    profile_batches: profile this range of batches, as `[first, last]`; empty profiles nothing.
    profile_every_task: profile on every task, each into its own directory; false profiles the
      chief alone.
  """
  log_dir: str | None = None
  update_freq: Literal["epoch", "batch"] = "epoch"
  profile_batches: tuple[int, ...] = _field(
      (), rule(lambda v: len(v) in (0, 2) and all(b > 0 for b in v) and list(v) == sorted(v),
               "must be empty or two batch numbers [first, last], 1 <= first <= last"))
  profile_every_task: bool = False


@dataclasses.dataclass(frozen=True)
class DataServiceConfig:
  """The tf.data service's options (its roles are `cluster.dispatcher` and
  `cluster.data_worker`).

  Attributes:
    work_dir: the dispatcher's journal, a directory it can write (shared storage where it may
      restart on another host): a dispatcher that dies and is restarted (tfdist launch restarts
      it alone) recovers its datasets, jobs and workers from it, and training goes on; None
      keeps its state in memory only. Needs the service's roles.
    passes: how the trainers read each epoch: "shared", one pass over the dataset every
      trainer shares (each example once an epoch over all of them: the service's
      `distributed_epoch`); "per_trainer", each trainer its own whole pass (each example once
      an epoch per trainer, so N trainers train on N times the data an epoch). Needs the
      service's roles. Either way the service splits each pass among the data workers as
      they ask (its DYNAMIC sharding: a data worker that dies loses at most what it held,
      never repeats it); its static policies (FILE, DATA, HINT) are not offered: they need
      every trainer to read only its own host's data worker, and a restarted worker reads its
      shard again from the start.
  """
  work_dir: str | None = None
  passes: Literal["shared", "per_trainer"] = "shared"


def _valid_stages(value) -> bool:
  if value == "balanced":
    return True
  if isinstance(value, Mapping):
    return all(isinstance(k, (str, int)) and isinstance(v, str) for k, v in value.items())
  return isinstance(value, (list, tuple)) and all(
      isinstance(stage, (list, tuple)) and stage and
      all(isinstance(item, (str, int)) and not isinstance(item, bool) for item in stage)
      for stage in value)


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
  """One model split over this process's devices (`tfdist.parallel`).

  Attributes:
    stages: "balanced" (contiguous stages of even parameter counts), a list per device of
      layer names or indices, or a map of layer names to devices; None splits nothing.
    devices: the stages' devices, in order; empty: this process's GPUs, else its CPUs.
    microbatches: parts each batch is split into, run as a pipeline (GPipe).
    recompute: recompute each layer's activations in the backward pass instead of keeping them.
  """
  stages: Any = _field(None, rule(_valid_stages, 'must be "balanced", a list of stages (lists '
                                  "of layer names or indices) or a map of layer names to "
                                  "devices"))
  devices: tuple[str, ...] = ()
  microbatches: int = _field(1, _POSITIVE)
  recompute: bool = False

  @property
  def enabled(self) -> bool:
    return self.stages is not None


@dataclasses.dataclass(frozen=True)
class Config:
  """A whole tfdist config: one YAML file, or a TF_CONFIG document.

  Attributes:
    cluster: the cluster's tasks; empty for training on one machine.
    task: the task this process runs; None until the launcher, TF_CONFIG or `--task` says.
    strategy: the strategy and its options.
    devices: local device set-up.
    training: batch sizes and speed knobs.
    checkpoint: checkpoint settings.
    tensorboard: TensorBoard settings.
    parallel: a model split over devices.
    data_service: the tf.data service's options.
    source: where the config came from (a path, `TF_CONFIG`, `<dict>`), for messages.

  Example:

  ```python
  import tfdist
  config = tfdist.load_config("configs/mirrored.yaml")   # a frozen, validated Config
  print(config.strategy.name, config.training.global_batch_size)
  ```
  """
  cluster: ClusterConfig = ClusterConfig()
  task: TaskConfig | None = None
  strategy: StrategyConfig = StrategyConfig()
  devices: DevicesConfig = DevicesConfig()
  training: TrainingConfig = TrainingConfig()
  checkpoint: CheckpointConfig = CheckpointConfig()
  tensorboard: TensorBoardConfig = TensorBoardConfig()
  parallel: ParallelConfig = ParallelConfig()
  data_service: DataServiceConfig = DataServiceConfig()
  source: str | None = dataclasses.field(default=None, compare=False)


SECTIONS = {"cluster": ClusterConfig, "task": TaskConfig, "strategy": StrategyConfig,
            "devices": DevicesConfig, "training": TrainingConfig, "checkpoint": CheckpointConfig,
            "tensorboard": TensorBoardConfig, "parallel": ParallelConfig,
            "data_service": DataServiceConfig}
"""Each top-level key of a config and its dataclass: what the loader reads, the reference
renders and the honoured table covers."""
