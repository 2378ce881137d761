"""Loads a config strictly: YAML or TF_CONFIG JSON in, a validated `Config` out.

Precedence, lowest first:
1. the defaults of `schema`;
2. the config file (or mapping);
3. the environment's `TF_CONFIG`: its cluster gives the addresses (its job sizes must match the
   file's, if the file has a cluster) and its task sets the task;
4. the `task` argument (the CLI's `--task`).

Only `yaml.safe_load` reads files, so YAML tags that construct objects are refused. Nothing here
imports TensorFlow: a bad config fails in well under a second.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import warnings
import types
import typing
from typing import Any, Literal, Mapping, Union

import yaml

from tfdist.config import rules, strategies
from tfdist.config.schema import (DATA_SERVICE_JOBS, JOBS, SECTIONS, ClusterConfig, Config,
                                  StrategyConfig, TaskConfig)
from tfdist.config.tf_config import parse_tf_config, split_address
from tfdist.errors import ConfigError

CONFIG_ENV = "TFDIST_CONFIG"
"""Names the config file of a launched process; `load_config()` reads it."""
FRESH_ENV = "TFDIST_FRESH"
"""Set to 1 (by `tfdist launch --fresh` for its first start): training starts over instead of
resuming from its backup."""
RUN_ENV = "TFDIST_RUN"
"""Names the run (`tensorboard.log_dir/<run>`); the launcher gives its log directory's name."""
MEMBERS_OF_ENV = "TFDIST_MEMBERS_OF"
"""Set by the launcher once workers are lost (`--min-workers`): the user's config file that
`TFDIST_CONFIG`, a copy of it with the cluster's current members, was made from. A launched
script's `load_config` of that file reads the copy (said once on stderr), so a script that loads
its config by path keeps working after a shrink."""
PREPARE_ENV = "TFDIST_PREPARE"
"""Set to 1 by the launcher in the processes that run the user's command: importing tfdist there
makes the strategy at once (`tfdist.strategy.startup`)."""
DATA_SERVICE_ENV = "TFDIST_DATA_SERVICE"
"""A launched task's tf.data service addresses, as JSON ({"dispatcher": [...], "data_worker":
[...]}): TF_CONFIG leaves these roles out (`tf_config.cluster_spec`)."""

# Keys TensorFlow's own TF_CONFIG documents carry beside cluster and task.
_TF_CONFIG_EXTRAS = ("environment", "rpc_layer")
_BOOLEAN_HINT = ("YAML reads unquoted yes/no/on/off/true/false as a boolean: quote the value")


def load_config(source: str | os.PathLike | Mapping | None = None, *,
                task: TaskConfig | str | None = None,
                environ: Mapping[str, str] | None = None) -> Config:
  """Loads and validates a config.

  Args:
    source: a YAML or TF_CONFIG-JSON file path, or a mapping of the same shape. None reads the
      file named by `$TFDIST_CONFIG`, else makes the config from `$TF_CONFIG` alone, else gives
      the default (one device).
    task: the task this process runs, overriding the file's and TF_CONFIG's: a `TaskConfig`
      or its `TYPE:INDEX` spelling (`"worker:1"`, as `--task` gives it).
    environ: the environment to read TF_CONFIG from; defaults to `os.environ`.

  Returns:
    The validated, frozen `Config`.

  Raises:
    ConfigError: a rule is broken; the message is one line naming the source and key.

  Example:

  ```python
  import tfdist
  config = tfdist.load_config("configs/mirrored.yaml")
  worker = tfdist.load_config({"strategy": "multi_worker_mirrored", "cluster": {"worker": 2}},
                              task="worker:1")
  ```
  """
  environ = os.environ if environ is None else environ
  if source is None and environ.get(CONFIG_ENV):
    source = environ[CONFIG_ENV]
  elif _is_members_origin(source, environ):
    source = environ[CONFIG_ENV]
    _say_members_once(environ[MEMBERS_OF_ENV], source)
  name, document = _read(source)
  try:
    config = _parse(document, name)
  except ConfigError as e:
    raise e.from_source(name) from None
  if "TF_CONFIG" in environ:
    try:
      config = _merge_tf_config(config, parse_tf_config(environ["TF_CONFIG"]),
                                environ.get(DATA_SERVICE_ENV))
    except ConfigError as e:
      raise e.from_source("TF_CONFIG") from None
  if task is not None:
    if isinstance(task, str):
      task = parse_task_flag(task)
    config = dataclasses.replace(config, task=task)
  config = rules.infer_strategy(config)
  rules.check(config)
  return config



def _is_members_origin(source, environ: Mapping[str, str]) -> bool:
  """Whether `source` is the file the launcher's members copy (`MEMBERS_OF_ENV`) came from."""
  origin = environ.get(MEMBERS_OF_ENV)
  if not origin or not environ.get(CONFIG_ENV) or not isinstance(source, (str, os.PathLike)):
    return False
  try:
    return os.path.samefile(source, origin)
  except OSError:  # Either is missing: `_read` names a missing `source` itself.
    return False


_SAID_MEMBERS = set()


def _say_members_once(origin: str, members: str) -> None:
  if members not in _SAID_MEMBERS:
    _SAID_MEMBERS.add(members)
    print(f"tfdist: {origin} read as the launcher's current members: {members} (workers were "
          "lost; tfdist launch --min-workers)", file=sys.stderr, flush=True)


ConfigLike = Config | str | os.PathLike | Mapping | None
"""What tfdist's functions take as a config: a `Config`, a YAML path, a mapping, or None (the
launched task's: TFDIST_CONFIG, then TF_CONFIG)."""


def as_config(config: ConfigLike) -> Config:
  """`config` itself when it is a `Config`, else `load_config(config)`.

  Args:
    config: a `Config`, a YAML path, a mapping, or None.

  Returns:
    The validated `Config`.

  Raises:
    ConfigError: what `load_config` raises.

  ```python
  config = as_config({"strategy": "mirrored"})
  ```
  """
  return config if isinstance(config, Config) else load_config(config)

def parse_task_flag(text: str, source: str = "--task") -> TaskConfig:
  """Parses `TYPE:INDEX` (as `--task worker:1`) into a `TaskConfig`."""
  job, sep, index = str(text).partition(":")
  if not sep or job not in JOBS or not index.isdigit():
    raise ConfigError(f"must be TYPE:INDEX with TYPE one of {', '.join(JOBS)}",
                      source=source, received=text)
  return TaskConfig(job, int(index))


def normalize_strategy_name(name: Any) -> str:
  """Maps `MirroredStrategy`, `multi-worker-mirrored`, ... to a declared strategy's name."""
  if isinstance(name, bool):
    raise ConfigError(f"must be one of {', '.join(strategies.names())}; {_BOOLEAN_HINT}",
                      key="strategy.name", received=name)
  if not isinstance(name, str):
    raise ConfigError(f"must be one of {', '.join(strategies.names())}", key="strategy.name",
                      received=name)
  squashed = name.lower().replace("_", "").replace("-", "").replace(" ", "")
  squashed = squashed.removesuffix("strategy")
  for canonical in strategies.names():
    if canonical.replace("_", "") == squashed:
      return canonical
  raise ConfigError(f"must be one of {', '.join(strategies.names())}", key="strategy.name",
                    received=name)


def build_section(cls: type, data: Any, key: str = "") -> Any:
  """Builds the dataclass `cls` from a mapping, strictly.

  Unknown keys, wrong types and broken field rules raise `ConfigError` naming `key.field`.
  """
  if data is None:
    data = {}
  if not isinstance(data, Mapping):
    raise ConfigError("must be a mapping", key=key or None, received=data)
  fields = {f.name: f for f in dataclasses.fields(cls)}
  hints = typing.get_type_hints(cls)
  kwargs = {}
  for name, value in data.items():
    path = f"{key}.{name}" if key else str(name)
    if name not in fields:
      known = ", ".join(fields) or "none"
      raise ConfigError(f"unknown key; the keys here are: {known}", key=path, received=name)
    value = _convert(value, hints[name], path)
    check, text = fields[name].metadata.get("rule", (None, None))
    if check is not None and value is not None and not check(value):
      raise ConfigError(text, key=path, received=value)
    kwargs[name] = value
  return cls(**kwargs)


def _convert(value: Any, hint: Any, key: str) -> Any:
  """Checks `value` against a type hint of the schema and converts lists to tuples."""
  origin, args = typing.get_origin(hint), typing.get_args(hint)
  if origin in (Union, types.UnionType):
    if value is None and type(None) in args:
      return None
    inner = [a for a in args if a is not type(None)]
    if len(inner) == 1:
      return _convert(value, inner[0], key)
    for member in inner:  # e.g. int | Literal["auto", "growth"]: the first that takes it.
      try:
        return _convert(value, member, key)
      except ConfigError:
        pass
    raise ConfigError(f"must be {' or '.join(map(_kind, inner))}", key=key, received=value)
  if origin is Literal:
    choices = ", ".join(map(str, args))
    if isinstance(value, bool):
      meant = _word_for_boolean(value, args)
      if meant is None:
        raise ConfigError(f"must be one of {choices}; {_BOOLEAN_HINT}", key=key, received=value)
      value = meant
    if value not in args:
      raise ConfigError(f"must be one of {choices}", key=key, received=value)
    return value
  if origin is tuple:
    if not isinstance(value, (list, tuple)):
      raise ConfigError(f"must be a list of {args[0].__name__}", key=key, received=value)
    return tuple(_convert(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
  if hint is bool:
    if not isinstance(value, bool):
      raise ConfigError("must be true or false", key=key, received=value)
  elif hint is int:
    if isinstance(value, bool) or not isinstance(value, int):
      raise ConfigError("must be an integer", key=key, received=value)
  elif hint is float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise ConfigError("must be a number", key=key, received=value)
    return float(value)
  elif hint is str:
    if isinstance(value, bool):
      raise ConfigError(f"must be a string; {_BOOLEAN_HINT}", key=key, received=value)
    if not isinstance(value, str):
      raise ConfigError("must be a string", key=key, received=value)
  return value


def _kind(hint) -> str:
  """A type hint of the schema in words, for an error: "an integer", "one of auto, growth"."""
  if typing.get_origin(hint) is Literal:
    return "one of " + ", ".join(map(str, typing.get_args(hint)))
  return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
      hint, getattr(hint, "__name__", str(hint)))


def _word_for_boolean(value: bool, choices) -> str | None:
  """The choice YAML turned into `value` (unquoted off/no/false read as False), when exactly
  one choice can be meant; else None."""
  words = ("on", "yes", "true") if value else ("off", "no", "false")
  meant = [c for c in choices if c in words]
  return meant[0] if len(meant) == 1 else None


def _read(source) -> tuple[str | None, Any]:
  """Returns (name for messages, parsed document) of a path, a mapping or None."""
  if source is None:
    return None, {}
  if isinstance(source, Mapping):
    return "<dict>", source
  name = os.fspath(source)
  try:
    with open(name, encoding="utf-8") as f:
      text = f.read()
  except OSError as e:
    raise ConfigError(f"cannot be read ({e.strerror})", source=name) from None
  try:
    # YAML is a superset of JSON: one parser reads both forms.
    document = yaml.safe_load(text)
  except yaml.constructor.ConstructorError as e:
    raise ConfigError("uses a YAML tag that constructs an object; tfdist reads plain YAML only",
                      source=name, key=_yaml_line(e), received=str(e.problem)) from None
  except yaml.YAMLError as e:
    raise ConfigError(f"is not valid YAML ({getattr(e, 'problem', None) or e})",
                      source=name, key=_yaml_line(e)) from None
  if document is None:
    raise ConfigError("is empty; give at least a strategy or a cluster", source=name)
  return name, document


def _yaml_line(error) -> str | None:
  mark = getattr(error, "problem_mark", None)
  return f"line {mark.line + 1}" if mark else None


def _parse(document: Any, name: str | None) -> Config:
  if not isinstance(document, Mapping):
    raise ConfigError("must be a mapping of sections (cluster, task, strategy, ...)",
                      received=document)
  document = _zero_stage_from_flags(_moved_to_training(_drop_tf_config_extras(document)))
  kwargs: dict[str, Any] = {"source": name}
  for key, value in document.items():
    if key not in SECTIONS:
      raise ConfigError(f"unknown section; the sections are: {', '.join(SECTIONS)}",
                        key=str(key), received=key)
    if key == "cluster":
      kwargs[key] = parse_cluster(value)
    elif key == "task":
      kwargs[key] = _parse_task(value)
    elif key == "strategy":
      kwargs[key] = _parse_strategy(value)
    else:
      kwargs[key] = build_section(SECTIONS[key], value, key)
  if "strategy" not in document:
    kwargs["strategy"] = None  # Inferred from the final cluster by rules.infer_strategy.
  return Config(**kwargs)


MOVED_TO_TRAINING = ("gradient_compression", "average_every")
"""Training options once spelled under `strategy:` (0.1), read there with a notice until 0.2."""


def _moved_to_training(document: Mapping) -> Mapping:
  """`document` with `strategy.<option>` of `MOVED_TO_TRAINING` moved to `training.<option>`,
  after a one-line notice (FutureWarning).

  Raises:
    ConfigError: both spellings given, differently.
  """
  strategy = document.get("strategy")
  if not isinstance(strategy, Mapping) or not set(MOVED_TO_TRAINING) & set(strategy):
    return document
  training = dict(document.get("training") or {})
  for key in MOVED_TO_TRAINING:
    if key not in strategy:
      continue
    if key in training and training[key] != strategy[key]:
      raise ConfigError(f"must be given alone; strategy.{key} ({strategy[key]!r}) is its old "
                        "spelling", key=f"training.{key}", received=training[key])
    training[key] = strategy[key]
    warnings.warn(f"strategy.{key} is now training.{key}; the old spelling goes in 0.2",
                  FutureWarning, stacklevel=4)
  return {**document, "training": training,
          "strategy": {k: v for k, v in strategy.items() if k not in MOVED_TO_TRAINING}}


ZERO_FLAGS = ("shard_optimizer", "shard_gradients", "shard_parameters")
"""0.1's spelling of `training.zero_stage`: a boolean a stage, each needing the one before;
read with a notice until 0.2."""


def _zero_stage_from_flags(document: Mapping) -> Mapping:
  """`document` with `training.shard_*` (`ZERO_FLAGS`) read as `training.zero_stage`, after
  a one-line notice (FutureWarning).

  Raises:
    ConfigError: a flag without the one before it, a flag not a boolean, or both spellings
      given, differently.
  """
  training = document.get("training")
  if not isinstance(training, Mapping) or not set(ZERO_FLAGS) & set(training):
    return document
  stage = 0
  for number, key in enumerate(ZERO_FLAGS, start=1):
    value = training.get(key, False)
    if not isinstance(value, bool):
      raise ConfigError("must be true or false", key=f"training.{key}", received=value)
    if value and stage != number - 1:
      raise ConfigError(f"needs training.{ZERO_FLAGS[number - 2]}: true (stage {number} "
                        f"shards on top of stage {number - 1}); or give training.zero_stage: "
                        f"{number}", key=f"training.{key}", received=True)
    stage = number if value else stage
  given = ", ".join(f"{k}: {str(training[k]).lower()}" for k in ZERO_FLAGS if k in training)
  if training.get("zero_stage", stage) != stage:
    raise ConfigError(f"must be given alone; {given} is its old spelling (stage {stage})",
                      key="training.zero_stage", received=training["zero_stage"])
  warnings.warn(f"training.{{{given}}} is now training.zero_stage: {stage}; the old spelling "
                "goes in 0.2", FutureWarning, stacklevel=4)
  return {**document, "training": {**{k: v for k, v in training.items() if k not in ZERO_FLAGS},
                                   "zero_stage": stage}}


def _drop_tf_config_extras(document: Mapping) -> Mapping:
  if document.get("rpc_layer", "grpc") != "grpc":
    raise ConfigError("must be grpc, the only RPC layer of TensorFlow's servers",
                      key="rpc_layer", received=document["rpc_layer"])
  return {k: v for k, v in document.items() if k not in _TF_CONFIG_EXTRAS}


def parse_cluster(data: Any, key: str = "cluster") -> ClusterConfig:
  """Reads a cluster: each job a count or a list of `host:port`."""
  if data is None:
    return ClusterConfig()
  if not isinstance(data, Mapping):
    raise ConfigError("must be a mapping of job names to address lists or counts",
                      key=key, received=data)
  counts, addresses = {}, {}
  for job, value in data.items():
    path = f"{key}.{job}"
    if job not in JOBS:
      raise ConfigError(f"unknown job; the jobs are: {', '.join(JOBS)}", key=path, received=job)
    if isinstance(value, int) and not isinstance(value, bool):
      if value < 0:
        raise ConfigError("a count must be 0 or greater", key=path, received=value)
      counts[job] = value
    elif isinstance(value, list):
      if not value:
        raise ConfigError("must list at least one \"host:port\" address; leave the job out "
                          "for none", key=path, received=value)
      for i, address in enumerate(value):
        try:
          split_address(address)
        except ConfigError as e:
          raise e.within(f"{path}[{i}]") from None
      addresses[job] = tuple(value)
    else:
      raise ConfigError('must be a count of tasks or a list of "host:port" addresses',
                        key=path, received=value)
  if counts and addresses:
    raise ConfigError("must give every job as counts (a cluster on this machine) or every job "
                      "as address lists (a real cluster), not both", key=key, received=dict(data))
  if addresses:
    rules.check_unique_addresses(addresses, key)
    return ClusterConfig(**{job: len(a) for job, a in addresses.items()}, addresses=addresses)
  return ClusterConfig(**counts)


def _parse_task(data: Any) -> TaskConfig:
  if isinstance(data, str):
    return parse_task_flag(data, source=None) if ":" in data else TaskConfig(data, 0)
  task = build_section(_TaskFields, data, "task")
  if task.type is None:
    raise ConfigError(f"needs a type: one of {', '.join(JOBS)}", key="task.type")
  return TaskConfig(task.type, task.index)


@dataclasses.dataclass(frozen=True)
class _TaskFields:
  type: str | None = None
  index: int = 0


def _parse_strategy(data: Any) -> StrategyConfig:
  if isinstance(data, str) or isinstance(data, bool):
    data = {"name": data}
  if not isinstance(data, Mapping):
    raise ConfigError("must be a strategy name or a mapping with a name and its options",
                      key="strategy", received=data)
  if "name" not in data:
    raise ConfigError(f"needs a name: one of {', '.join(strategies.names())}", key="strategy.name")
  name = normalize_strategy_name(data["name"])
  options = {k: v for k, v in data.items() if k != "name"}
  return StrategyConfig(name, make_options(name, options))


def make_options(name: str, options: Mapping) -> Any:
  """Builds the options dataclass of strategy `name`, strictly (shared by YAML and functions)."""
  cls = strategies.kind(name).options
  for key, value in options.items():
    if key not in {f.name for f in dataclasses.fields(cls)}:
      known = ", ".join(f.name for f in dataclasses.fields(cls)) or "none"
      raise ConfigError(f"is not an option of {name}; its options are: {known}",
                        key=f"strategy.{key}", received=value)
  return build_section(cls, options, "strategy")


def _merge_tf_config(config: Config, document: Mapping, data_service: str | None = None
                     ) -> Config:
  """Applies TF_CONFIG over the file: its addresses and its task win; the tf.data service's
  addresses come from `data_service` (`DATA_SERVICE_ENV`'s JSON), TF_CONFIG having none."""
  document = _drop_tf_config_extras(document)
  unknown = sorted(set(document) - {"cluster", "task"})
  if unknown:
    raise ConfigError("unknown key; TF_CONFIG holds cluster and task", key=unknown[0],
                      received=unknown[0])
  changes = {}
  if "cluster" in document:
    env_cluster = parse_cluster(document["cluster"])
    if env_cluster.addresses is None and not env_cluster.is_empty:
      raise ConfigError('must list "host:port" addresses, not counts', key="cluster",
                        received=dict(document["cluster"]))
    if data_service and env_cluster.addresses is not None:
      served = parse_cluster(json.loads(data_service), key=DATA_SERVICE_ENV)
      env_cluster = dataclasses.replace(
          env_cluster, dispatcher=served.dispatcher, data_worker=served.data_worker,
          addresses={**env_cluster.addresses, **(served.addresses or {})})
    expected = {job: count for job, count in config.cluster.counts().items()
                if data_service or job not in DATA_SERVICE_JOBS}
    if not config.cluster.is_empty and expected != env_cluster.counts():
      raise ConfigError(f"must have the job sizes of {config.source or 'the config'} "
                        f"({expected})", key="cluster", received=env_cluster.counts())
    if not data_service:  # The file's tf.data service roles, TF_CONFIG having none.
      env_cluster = dataclasses.replace(env_cluster, dispatcher=config.cluster.dispatcher,
                                        data_worker=config.cluster.data_worker)
    changes["cluster"] = env_cluster
  if "task" in document:
    changes["task"] = _parse_task(document["task"])
  return dataclasses.replace(config, **changes)



def config_to_dict(config: Config) -> dict:
  """The config as plain data in the YAML's shape; `load_config` of it gives `config` back."""
  cluster = config.cluster
  document = {"cluster": ({job: list(cluster.addresses[job]) for job in cluster.jobs
                           if job in cluster.addresses}
                          if cluster.has_addresses else cluster.counts())}
  if config.task is not None:
    document["task"] = {"type": config.task.type, "index": config.task.index}
  document["strategy"] = {"name": config.strategy.name,
                          **_plain(dataclasses.asdict(config.strategy.options))}
  for section in [name for name in SECTIONS if name not in ("cluster", "task", "strategy")]:
    document[section] = _plain(dataclasses.asdict(getattr(config, section)))
  return document


def _plain(data: dict) -> dict:
  return {k: list(v) if isinstance(v, tuple) else v for k, v in data.items()}
