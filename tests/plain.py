"""Runs a guide's program with plain TensorFlow and no tfdist, the references the guides'
corpus (tests/test_guides.py) compares each launched page with:

    python -m tests.plain one_device REPLICAS PROGRAM [ARGS...]
    python -m tests.plain cpus N PROGRAM [ARGS...]

`one_device`: the program's `tf.distribute.MirroredStrategy()`,
`MultiWorkerMirroredStrategy()` and `ParameterServerStrategy(...)` are TensorFlow's default
strategy (no strategy: Keras builds and trains as on one device), telling the program it has REPLICAS replicas so that it batches the launched run's global batch; a
multi-worker page's `strategy.cluster_resolver` is that of a single worker (task type None, the
case TensorFlow's tutorial writes for one worker). Keras under any strategy draws a batch from a
throw-away iterator to build the model, so plain TensorFlow's own one-replica strategy starts a
reshuffling dataset at its second pass: without a strategy it starts at its first, as tfdist's
replicas do.

`cpus`: the program as it is, on N logical CPUs made first (plain TensorFlow's own replicas of
its `MirroredStrategy()`).
"""

import runpy
import sys

import tensorflow as tf


class _SingleWorker:
  """A cluster resolver of no cluster: the tutorial's `_is_chief` counts task type None as the
  chief."""
  task_type = None
  task_id = None

  def cluster_spec(self):
    return tf.train.ClusterSpec({})


def _one_device(replicas: int):
  class OneDevice:
    """TensorFlow's default strategy, saying it has `replicas` replicas."""

    def __init__(self, *args, **kwargs):
      self._default = tf.distribute.get_strategy()
      self.cluster_resolver = _SingleWorker()

    num_replicas_in_sync = replicas

    def __getattr__(self, name):
      return getattr(self._default, name)
  return OneDevice


def main(argv):
  mode, count, program = argv[1], int(argv[2]), argv[3]
  if mode == "one_device":
    strategy = _one_device(count)
    tf.distribute.MirroredStrategy = tf.distribute.MultiWorkerMirroredStrategy = strategy
    tf.distribute.ParameterServerStrategy = strategy
  else:
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration() for _ in range(count)])
  sys.argv = [program, *argv[4:]]
  runpy.run_path(program, run_name="__main__")


if __name__ == "__main__":
  main(sys.argv)
