"""Every worker's answer to one yes-or-no question, asked after the same call: MultiWorkerMirrored
workers run each call in lockstep, so they all ask at the same call and all get the same answer
(one compiled all-reduce of one number). A read of the coordination service's key-value store
cannot tell "absent" from "slow": a worker went on alone and its peer's collectives failed.

```python
vote = Vote(strategy, progress.Collective.PREEMPTION_AGREEMENT)
if vote.any(noticed):   # after every call, on every worker
  ...
```
"""

from __future__ import annotations

import tfdist.progress as progress


class Vote:
  """One question every worker answers after the same call.

  Args:
    strategy: the MultiWorkerMirrored strategy whose workers answer.
    collective: where a task waiting in the vote is said to wait (the hang watch's name).
  """

  def __init__(self, strategy, collective: progress.Collective):
    self._strategy, self._collective = strategy, collective
    self._summed = None

  def any(self, yes: bool) -> bool:
    """Whether some worker said yes."""
    return self._sum(yes) > 0

  def every(self, yes: bool) -> bool:
    """Whether every worker said yes."""
    return self._sum(yes) >= self._strategy.num_replicas_in_sync

  def _sum(self, yes: bool) -> float:
    """The replicas' answers summed (each of a worker's replicas answers as its worker)."""
    if self._summed is None:
      self._summed = _summed(self._strategy)
    with progress.collective(self._collective):
      return self._summed(float(yes))


def _summed(strategy):
  import tensorflow as tf

  @tf.function
  def summed(value):
    return strategy.reduce(tf.distribute.ReduceOp.SUM,
                           strategy.run(lambda: tf.identity(value)), axis=None)
  return lambda value: float(summed(tf.constant(value, tf.float32)).numpy())


def agreed_token(strategy, collective: progress.Collective) -> int:
  """A number drawn at random by the first replica and held alike by every worker (one
  all-reduce under a multi-worker strategy): a name this run's workers share and a restarted
  run does not.

  Args:
    strategy: the run's strategy.
    collective: where a task waiting for it is said to wait (the hang watch's name).

  Returns:
    An int below 2**24 (exact in the float32 all-reduce).
  """
  import tensorflow as tf
  from tfdist.data_service.reading import new_token
  drawn = new_token()
  if getattr(strategy.extended, "_num_workers", 1) <= 1:  # No public count; one draws.
    return drawn

  @tf.function
  def first_replicas():
    def mine():
      first = tf.equal(tf.distribute.get_replica_context().replica_id_in_sync_group, 0)
      return tf.where(first, tf.constant(float(drawn)), 0.0)
    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(mine), axis=None)
  with progress.collective(collective):
    return int(first_replicas().numpy())
