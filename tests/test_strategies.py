"""Every strategy made for real from the example configs and from the factory functions.

This test process splits its CPU into 2 logical devices once (the `two_cpus` fixture); the
multi-worker strategies run in processes of their own (tests/test_multi_worker.py).
"""

import pytest
import tensorflow as tf

import tfdist
from tfdist import ConfigError, DeviceSetupError, load_config
from tfdist.config import DevicesConfig
from tests.conftest import CONFIGS

pytestmark = pytest.mark.usefixtures("two_cpus")


def replica_sum(strategy):
  """All-reduces 1 + the replica id over the strategy's replicas."""
  def step():
    context = tf.distribute.get_replica_context()
    return context.all_reduce("sum", tf.cast(context.replica_id_in_sync_group, tf.float32) + 1)
  return strategy.reduce("mean", strategy.run(tf.function(step)), axis=None).numpy()


def test_mirrored_config_mirrors_over_two_logical_cpus():
  strategy = tfdist.make_strategy(load_config(CONFIGS / "mirrored.yaml", environ={}))
  assert isinstance(strategy, tf.distribute.MirroredStrategy)
  assert [d.rsplit("/", 1)[-1] for d in strategy.extended.worker_devices] == [
      "device:CPU:0", "device:CPU:1"]
  assert replica_sum(strategy) == 3.0


def test_mirrored_variables_have_one_copy_per_device():
  strategy = tfdist.mirrored(logical_cpus=2)
  with strategy.scope():
    variable = tf.Variable(2.0)
  assert len(variable.values) == 2


@pytest.mark.parametrize("name,cls", [
    ("hierarchical_copy", tf.distribute.HierarchicalCopyAllReduce),
    ("reduction_to_one", tf.distribute.ReductionToOneDevice),
    ("nccl", tf.distribute.NcclAllReduce),  # GPU-only at run time; constructed here.
])
def test_mirrored_cross_device_ops(name, cls):
  strategy = tfdist.mirrored(cross_device_ops=name, logical_cpus=2)
  assert isinstance(strategy.extended._cross_device_ops, cls)


def test_central_storage_keeps_variables_on_the_parameter_device():
  strategy = tfdist.make_strategy(load_config(CONFIGS / "central_storage.yaml", environ={}))
  assert isinstance(strategy, tf.distribute.experimental.CentralStorageStrategy)
  assert strategy.num_replicas_in_sync == 2
  with strategy.scope():
    variable = tf.Variable(1.0)
  assert variable.device.endswith("CPU:0")
  assert replica_sum(strategy) == 3.0


def test_default_and_one_device():
  assert tfdist.make_strategy(load_config(CONFIGS / "default.yaml", environ={})) is \
      tf.distribute.get_strategy()
  strategy = tfdist.one_device("/cpu:1")
  assert isinstance(strategy, tf.distribute.OneDeviceStrategy)
  assert strategy.extended.worker_devices[0].endswith("CPU:1")


def test_single_worker_multi_worker_mirrored_runs_locally():
  strategy = tfdist.multi_worker_mirrored(config={})
  assert strategy.num_replicas_in_sync == 1
  assert strategy.cluster_resolver.cluster_spec().as_dict() == {}


def test_factory_options_follow_the_yaml_rules():
  with pytest.raises(ConfigError, match=r"^strategy.communication: must be one of auto, ring, "
                     r"nccl. Received: 'mpi'$"):
    tfdist.multi_worker_mirrored("mpi", config={})


def test_factory_refuses_a_single_machine_strategy_for_a_cluster():
  cluster = {"cluster": {"worker": ["127.0.0.1:2001", "127.0.0.1:2002"]}}
  with pytest.raises(ConfigError, match="mirrored runs on one machine"):
    tfdist.make_strategy(load_config({**cluster, "strategy": "mirrored"}, environ={}))


def test_counts_cluster_needs_the_launcher():
  config = load_config(CONFIGS / "multi_worker_mirrored.yaml", task="worker:0", environ={})
  with pytest.raises(ConfigError, match=r"cluster: gives task counts, whose addresses `tfdist "
                     r"launch` assigns.*Received: \{'worker': 2\}"):
    tfdist.make_strategy(config)


def test_parameter_server_worker_runs_a_server_not_a_strategy():
  config = load_config({"cluster": {"chief": ["127.0.0.1:2000"], "worker": ["127.0.0.1:2001"],
                                    "ps": ["127.0.0.1:2002"]}}, task="worker:0", environ={})
  with pytest.raises(ConfigError, match=r"worker:0 of a parameter_server cluster runs a server"):
    tfdist.make_strategy(config)


def test_evaluator_gets_the_default_strategy():
  config = load_config({"cluster": {"worker": ["127.0.0.1:2001", "127.0.0.1:2002"],
                                    "evaluator": ["127.0.0.1:2003"]}},
                       task="evaluator:0", environ={})
  assert tfdist.make_strategy(config) is tf.distribute.get_strategy()


def test_splitting_devices_after_tensorflow_started_is_a_clear_error():
  with pytest.raises(DeviceSetupError, match=r"logical_cpus=3 with 2 CPU device\(s\) already "
                     r"initialised"):
    tfdist.configure_devices(DevicesConfig(logical_cpus=3))


def test_asking_again_for_the_same_split_is_fine():
  tfdist.configure_devices(DevicesConfig(logical_cpus=2))
  assert len(tf.config.list_logical_devices("CPU")) == 2


def test_resolver_counts_local_gpus_for_multi_worker_strategies():
  config = load_config({"cluster": {"worker": ["127.0.0.1:2001", "127.0.0.1:2002"]}},
                       task="worker:1", environ={})
  resolver = tfdist.cluster_resolver(config)
  assert resolver.num_accelerators() == {"GPU": len(tf.config.list_physical_devices("GPU"))}
  assert (resolver.task_type, resolver.task_id) == ("worker", 1)


def test_same_setting_gives_the_same_strategy_so_collectives_do_not_collide():
  config = load_config(CONFIGS / "mirrored.yaml", environ={})
  first = tfdist.make_strategy(config)
  assert tfdist.make_strategy(load_config(CONFIGS / "mirrored.yaml", environ={})) is first
  # The same devices asked for otherwise (by name, by the factory function, with or without
  # logical_cpus, as keras.distribution's DataParallel asks): the same strategy, not a second
  # one whose collectives would abort the first's ("Shape mismatch in the collective instance").
  assert tfdist.mirrored() is first and tfdist.mirrored(["/cpu:0", "/cpu:1"]) is first
  assert tfdist.make_strategy({"strategy": "mirrored", "devices": {"logical_cpus": 2}}) is first
  for size in (3, 5):  # Two all-reduces of different shapes, as two models' gradients.
    values = first.run(tf.function(lambda: tf.distribute.get_replica_context().all_reduce(
        "sum", tf.ones([size]))))
    assert first.experimental_local_results(values)[0].numpy().tolist() == [2.0] * size


def test_a_strategy_is_added_by_its_declaration_and_its_builder_alone(monkeypatch, capsys):
  """A fake strategy, `pinned` (everything on the second logical CPU), declared in
  `strategies.KINDS` and built by one function in `factory.BUILDERS`: the loader, the rules, the
  batch arithmetic, the settings, the references, `tfdist check` and `tfdist.fit` take it."""
  import dataclasses

  import keras
  import numpy as np
  from tfdist.cli import check
  from tfdist.config import reference, schema, strategies
  from tfdist.strategy import factory

  @dataclasses.dataclass(frozen=True)
  class PinnedOptions:
    """`pinned` options.

    Attributes:
      device: where everything goes.
    """
    device: str = "/cpu:1"

  monkeypatch.setitem(strategies.KINDS, "pinned", strategies.StrategyKind(
      "pinned", PinnedOptions, supports=frozenset()))
  monkeypatch.setitem(factory.BUILDERS, "pinned",
                      lambda options, config: tf.distribute.OneDeviceStrategy(options.device))

  config = load_config({"strategy": "PinnedStrategy", "training": {
      "global_batch_size": 16, "mixed_precision": "off", "gradient_accumulation_steps": 2}})
  assert (config.strategy.name, config.strategy.options.device) == ("pinned", "/cpu:1")
  assert tfdist.replica_count(config) == 1
  assert "strategy.device" in dict(reference.rows()) and "pinned" in reference.markdown()
  assert "replicas in sync: 1" in check.render(config, 0)
  with pytest.raises(ConfigError, match=r"training.zero_stage: needs strategy mirrored or "
                                        r"multi_worker_mirrored.*pinned does not"):
    load_config({"strategy": "pinned", "training": {"zero_stage": 1}})
  with pytest.raises(ConfigError, match=r"pinned runs on one machine"):
    load_config({"strategy": "pinned", "cluster": {"worker": 2}})
  with pytest.raises(ConfigError, match=r"parallel.stages: needs strategy default"):
    load_config({"strategy": "pinned", "parallel": {"stages": "balanced"}})

  x = np.random.default_rng(0).random((64, 4), dtype=np.float32)
  history = tfdist.fit(lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]),
                       x, x.sum(axis=1), config=config, epochs=1, verbose=0,
                       compile=dict(optimizer="sgd", loss="mse"))
  assert history.model.layers[0].kernel.value.device.endswith("CPU:1")
  assert capsys.readouterr().out.startswith("tfdist: pinned, 1 replica, global batch 16")
  assert schema.StrategyConfig().name in strategies.names()
