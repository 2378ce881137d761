"""Nothing tfdist accepts is ignored (issue 50): the suite generated from the one table of what
each training path does with each config key (`tfdist.config.honoured`). A key of the schema
without a decision, a decision without a test that checks it, or a refusal that does not refuse,
fails here."""

import ast
import dataclasses
import typing

import pytest

import tfdist
from tfdist.config import honoured, reference, schema, strategies
from tfdist.training import settings
from tests.conftest import REPO

_KEYS = list(dict.fromkeys(key for key, _ in reference.rows()))
# Applied but not checked against a reference by the suite, each with why: the list can only
# shrink (a new key must name its test).
_UNCHECKED = {
    "strategy.timeout_seconds": "TensorFlow's own collective time-out, passed through: waiting "
                                "it out takes its whole length",
    "tensorboard.profile_every_task": "a profile per task of a 2-worker cluster: the chief's "
                                      "profile is checked, every task's is not",
}


def _tests() -> set[str]:
  """Every `file.py::test_name` of the suite."""
  found = set()
  for path in (REPO / "tests").glob("test_*.py"):
    tree = ast.parse(path.read_text())
    found |= {f"{path.name}::{node.name}" for node in tree.body
              if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}
  return found


def test_every_key_of_the_schema_has_one_decision_and_only_those():
  assert set(_KEYS) == set(honoured.DECISIONS), set(_KEYS) ^ set(honoured.DECISIONS)


@pytest.mark.parametrize("key", _KEYS)
def test_every_key_says_what_each_path_does_and_names_the_tests_checking_it(key):
  decision = honoured.DECISIONS[key]
  assert decision.applied.strip(), key
  assert set(decision.refused) <= set(honoured.PATHS), key
  assert all(why.strip() for why in decision.refused.values()), key
  if key in _UNCHECKED:
    assert not decision.checked_by, f"{key} is checked now: take it off _UNCHECKED"
    return
  assert decision.checked_by, f"{key}: name the test checking it, or say why none does"
  missing = set(decision.checked_by) - _tests()
  assert not missing, missing


def _asked(key: str):
  """A value of `key` other than its default, of its declared type."""
  examples = {"parallel.stages": "balanced", "parallel.devices": ("/cpu:0",),
              "tensorboard.profile_batches": (2, 3), "strategy.devices": ("/cpu:0",),
              "strategy.compute_devices": ("/cpu:0",), "devices.gpu_memory": "growth",
              "strategy.name": "mirrored"}
  if key in examples:
    return examples[key]
  default = honoured.default(key)
  if isinstance(default, bool):
    return not default
  if isinstance(default, int):
    return default + 2
  section, name = key.split(".", 1)
  if section == "strategy":
    cls = next(k.options for k in strategies.KINDS.values()
               if name in {f.name for f in dataclasses.fields(k.options)})
  else:
    cls = {"training": schema.TrainingConfig, "checkpoint": schema.CheckpointConfig,
           "tensorboard": schema.TensorBoardConfig, "devices": schema.DevicesConfig,
           "cluster": schema.ClusterConfig, "data_service": schema.DataServiceConfig}[section]
  kind = typing.get_type_hints(cls)[name]
  choices = [c for c in typing.get_args(kind) if isinstance(c, str)] or \
      [c for arg in typing.get_args(kind) for c in typing.get_args(arg) if isinstance(c, str)]
  return next((c for c in choices if c != default), 3 if kind != str else "x")


def _config_asking(key: str) -> schema.Config:
  """The default config with `key` asked for (sections replaced: the refusal reads values)."""
  config, (section, name), value = schema.Config(), key.split(".", 1), _asked(key)
  if section == "strategy":
    if name == "name":
      return dataclasses.replace(config, strategy=schema.StrategyConfig(
          value, strategies.kind(value).options()))
    kind = next(k for k in strategies.KINDS.values()
                if name in {f.name for f in dataclasses.fields(k.options)})
    return dataclasses.replace(config, strategy=schema.StrategyConfig(
        kind.name, kind.options(**{name: value})))
  if section == "task":
    return dataclasses.replace(config, task=dataclasses.replace(schema.TaskConfig("worker"),
                                                                **{name: value}))
  return dataclasses.replace(config, **{section: dataclasses.replace(getattr(config, section),
                                                                     **{name: value})})


_REFUSALS = [(key, path) for key in _KEYS for path in honoured.DECISIONS[key].refused]


@pytest.mark.parametrize("key,path", _REFUSALS)
def test_each_refusal_refuses_its_key_on_its_path_in_one_line(key, path):
  config = _config_asking(key)
  assert honoured.asked(config, key), key
  with pytest.raises(tfdist.ConfigError) as refused:
    settings.refuse_unhonoured(config, (path,), (key,))
  why = honoured.DECISIONS[key].refused[path]
  assert str(refused.value).startswith(f"{key}: is not honoured by {path}: {why}. Received: ")
  assert "\n" not in str(refused.value)
  assert honoured.refusal(schema.Config(), (path,), (key,)) is None  # Not asked: nothing.


def test_the_loop_refuses_what_it_does_not_apply_through_its_own_constructor(tmp_path):
  with pytest.raises(tfdist.ConfigError, match=r"^<dict>: tensorboard.log_dir: is not honoured "
                                               r"by tfdist.TrainingLoop: the loop writes no "
                                               r"TensorBoard files"):
    tfdist.TrainingLoop({"tensorboard": {"log_dir": str(tmp_path)}})


def test_keras_own_fit_refuses_the_training_keys_it_does_not_apply():
  import keras
  keras.distribution.set_distribution(keras.distribution.DataParallel(
      devices=keras.distribution.list_devices()[:2]))
  try:
    with pytest.raises(tfdist.ConfigError, match=r"^<dict>: training.steps_per_execution: is "
                                                 r"not honoured by Keras's own fit after "
                                                 r"tfdist.use_keras_distribution\(\): "
                                                 r"Keras's own fit takes its training"):
      tfdist.use_keras_distribution({"training": {"steps_per_execution": 4}})
  finally:
    keras.distribution.set_distribution(None)


_NEEDS = [(key, name) for key in _KEYS if honoured.DECISIONS[key].needs
          for name in strategies.names()]


@pytest.mark.parametrize("key,name", _NEEDS)
def test_a_key_needing_a_strategy_feature_is_refused_exactly_where_the_strategy_lacks_it(key, name):
  """Derived from the table: each key's `needs`, under every strategy; the config's rules refuse
  it (through `load_config`) where the strategy's declaration lacks the feature, not elsewhere."""
  needs = honoured.DECISIONS[key].needs
  asked = needs.values[0] if needs.values else _asked(key)
  section, field = key.split(".")
  config = dataclasses.replace(schema.Config(), strategy=schema.StrategyConfig(
      name, strategies.kind(name).options()))
  config = dataclasses.replace(config, **{section: dataclasses.replace(
      getattr(config, section), **{field: asked})})
  lacks = needs.feature not in strategies.kind(name).supports
  assert (honoured.unsupported(config) is not None) == lacks, (key, name)
  if lacks:
    cluster = {"chief": 1, "worker": 1, "ps": 1} if strategies.kind(name).asynchronous else {}
    with pytest.raises(tfdist.ConfigError) as refused:
      tfdist.load_config({"cluster": cluster, "strategy": name, section: {field: asked}})
    assert str(refused.value).startswith(f"<dict>: {key}: "), refused.value
    assert name in str(refused.value) and "\n" not in str(refused.value)


def test_every_strategy_feature_is_what_some_key_needs():
  needed = {d.needs.feature for d in honoured.DECISIONS.values() if d.needs}
  assert needed == set(strategies.FEATURES)


@pytest.mark.parametrize("text,message", [
    ({"parallel": {"microbatches": 2}}, "parallel.microbatches: needs parallel.stages"),
    ({"parallel": {"recompute": True}}, "parallel.recompute: needs parallel.stages"),
    ({"cluster": {"chief": 1, "worker": 1, "ps": 1},
      "strategy": {"name": "parameter_server", "min_shard_bytes": 1024}},
     "strategy.min_shard_bytes: needs strategy.max_shards above 1"),
    ({"cluster": {"worker": 2}, "data_service": {"passes": "per_trainer"}},
     "data_service.passes: says how trainers read through the tf.data service: give the "
     "cluster cluster.dispatcher and cluster.data_worker, or leave it out. Received: "
     "'per_trainer'"),
])
def test_keys_that_need_another_are_refused_without_it(text, message):
  with pytest.raises(tfdist.ConfigError, match=f"^<dict>: {message}"):
    tfdist.load_config(text)


def test_max_to_keep_keeps_that_many_of_the_newest_checkpoints(tmp_path):
  """Counted by hand: 4 epochs, 2 kept, the last two epochs' files."""
  import keras
  import numpy as np
  x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
  config = {"training": {"global_batch_size": 32, "mixed_precision": "off"},
            "checkpoint": {"dir": str(tmp_path), "max_to_keep": 2}}
  tfdist.fit(lambda: keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]), x, x[:, :1],
             config=config, compile=dict(optimizer="sgd", loss="mse"), epochs=4, verbose=0)
  assert sorted(p.name for p in tmp_path.glob("epoch-*.weights.h5")) == [
      "epoch-0003.weights.h5", "epoch-0004.weights.h5"]
