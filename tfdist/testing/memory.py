"""What a process holds, for tests and benchmarks: every TensorFlow variable alive, by device."""

from __future__ import annotations

import gc

import numpy as np


def held_beyond_weights(model) -> dict[str, int]:
  """{device: bytes} of every TensorFlow variable this process holds (found by the garbage
  collector, so a buffer no one declared is counted too), the model's weights aside: the
  optimizer's state, counters, metrics.

  Args:
    model: the trained Keras model whose weights are left out (each replica's copy).

  Returns:
    Bytes by device, as TensorFlow names it ("/job:localhost/replica:0/task:0/device:CPU:0").

  Example:

  ```python
  import keras
  import numpy as np
  import tfdist
  from tfdist.testing import held_beyond_weights
  x, y = np.random.rand(64, 4).astype("float32"), np.random.rand(64, 1).astype("float32")
  def make_model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
  history = tfdist.fit(make_model, x, y, config="configs/mirrored.yaml", epochs=1,
                       compile=dict(optimizer="adam", loss="mse"), verbose=0)
  held_beyond_weights(history.model)   # {".../device:CPU:0": 64, ".../device:CPU:1": 64}
  ```
  """
  strategy = model.distribute_strategy
  return held_variables({id(component) for w in model.weights
                         for component in strategy.experimental_local_results(w.value)})


def held_variables(leaving_out=frozenset()) -> dict[str, int]:
  """{device: bytes} of every TensorFlow variable this process holds, found by the garbage
  collector, but those whose `id` is in `leaving_out`.

  Args:
    leaving_out: the `id`s of variables not to count (each replica's component, by its own).

  Returns:
    Bytes by device, as TensorFlow names it ("/job:localhost/replica:0/task:0/device:CPU:0").

  Example:

  ```python
  import tensorflow as tf
  from tfdist.testing import held_variables
  weights = tf.Variable(tf.zeros([256]))
  held_variables()                    # {".../device:CPU:0": 1024, ...}: every variable alive
  held_variables({id(weights)})       # the same, less those 1024 bytes
  ```
  """
  import tensorflow as tf
  from tensorflow.python.ops import resource_variable_ops
  gc.collect()
  held: dict[str, int] = {}
  for obj in gc.get_objects():
    if isinstance(obj, resource_variable_ops.BaseResourceVariable) and \
        id(obj) not in leaving_out:
      device = tf.DeviceSpec.from_string(obj.device).to_string()
      held[device] = held.get(device, 0) + int(np.prod(obj.shape)) * obj.dtype.size
  return held
