"""The strategies tfdist runs, declared once: what each one is and what it supports.

The loader, the cross-section rules, the batch arithmetic, the training paths, the launcher and
the CLI read a strategy's facts from its `StrategyKind` here, never from its name; the only
other place a strategy's name is written is its builder in `tfdist.strategy.factory`. Adding a
strategy is one `StrategyKind` in `KINDS` and one builder in `factory.BUILDERS`
(tests/test_strategies.py registers a fake one through both and trains with it).

```python
from tfdist.config import strategies
kind = strategies.kind("mirrored")
kind.across_workers, "sharding" in kind.supports     # (False, True)
strategies.supporting("split")                       # ("default", "multi_worker_mirrored")
```
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from tfdist.config import schema

FEATURES = ("split", "compression", "averaging", "sharding", "jit", "loss_scaling")
"""What a strategy may support: each is what a config key needs of its strategy, declared with
the key (`tfdist.config.honoured.Needs`): the config's rules refuse the key under a strategy
without it, and the docs' config reference says which strategies honour it."""


@dataclasses.dataclass(frozen=True)
class StrategyKind:
  """One `tf.distribute` strategy as tfdist runs it.

  Attributes:
    name: its name in `strategy.name`, `tfdist.make_strategy` and every message.
    options: its options dataclass (`tfdist.config.schema`).
    across_workers: runs over a cluster of several processes (TF_CONFIG); False: one machine.
    asynchronous: workers update the variables without waiting for each other (parameter
      servers): the chief coordinates, the workers and ps run servers.
    replicas: how its replica count is made: "one"; "local" (this machine's devices, or the
      devices its `devices_option` lists); "workers" (the training tasks x each one's GPUs);
      "worker" (one worker's GPUs: a parameter-server step runs on one worker).
    devices_option: the option naming the devices its replicas run on, if any.
    supports: the `FEATURES` it supports.
    tf_class: the `tf.distribute` class a script makes for it itself, as a dotted path below
      `tf.distribute` (None: the default strategy, which no script makes).
  """
  name: str
  options: type
  across_workers: bool = False
  asynchronous: bool = False
  replicas: Literal["one", "local", "workers", "worker"] = "one"
  devices_option: str | None = None
  supports: frozenset = frozenset()
  tf_class: str | None = None

  @property
  def all_reduces_across_workers(self) -> bool:
    """Synchronous replicas in several processes: gradients all-reduced between workers."""
    return self.across_workers and not self.asynchronous


def _kind(name, options, *supports, **facts) -> StrategyKind:
  unknown = set(supports) - set(FEATURES)
  assert not unknown, unknown
  return StrategyKind(name, options, supports=frozenset(supports), **facts)


KINDS: dict[str, StrategyKind] = {kind.name: kind for kind in (
    _kind("default", schema.DefaultOptions, "split", "jit", "loss_scaling"),
    _kind("one_device", schema.OneDeviceOptions, "jit", "loss_scaling",
          tf_class="OneDeviceStrategy"),
    _kind("mirrored", schema.MirroredOptions, "compression", "sharding", "loss_scaling",
          replicas="local", devices_option="devices", tf_class="MirroredStrategy"),
    _kind("multi_worker_mirrored", schema.MultiWorkerMirroredOptions, "split", "compression",
          "averaging", "sharding", "loss_scaling", across_workers=True, replicas="workers",
          tf_class="MultiWorkerMirroredStrategy"),
    _kind("central_storage", schema.CentralStorageOptions, replicas="local",
          devices_option="compute_devices", tf_class="experimental.CentralStorageStrategy"),
    _kind("parameter_server", schema.ParameterServerOptions, "loss_scaling",
          across_workers=True, asynchronous=True, replicas="worker",
          tf_class="ParameterServerStrategy"),
)}
"""Every strategy, by name, in the order messages list them."""


def names() -> tuple[str, ...]:
  """The strategies' names, in `KINDS`' order."""
  return tuple(KINDS)


def kind(name: str) -> StrategyKind:
  """The declaration of strategy `name` (a name the loader accepted)."""
  return KINDS[name]


def supporting(feature: str) -> tuple[str, ...]:
  """The names of the strategies that support `feature` (one of `FEATURES`). Pure."""
  assert feature in FEATURES, feature
  return tuple(name for name, k in KINDS.items() if feature in k.supports)


def across_workers(asynchronous: bool) -> str:
  """The name of the strategy that runs a cluster of several workers: with parameter servers
  (`asynchronous`) or all-reducing between them."""
  return next(name for name, k in KINDS.items()
              if k.across_workers and k.asynchronous == asynchronous)


def inferred(cluster: schema.ClusterConfig) -> str:
  """The strategy a config without a `strategy` section gets from its cluster: parameter
  servers where it has ps tasks, all-reduce across workers where it has several, else the
  default strategy. Pure."""
  if cluster.ps:
    return across_workers(asynchronous=True)
  return across_workers(asynchronous=False) if cluster.training_tasks > 1 else "default"
