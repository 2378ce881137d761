"""The one place tfdist replaces a Keras private: `optimizer._all_reduce_sum_gradients`, Keras's
sum of each replica's gradients under a tf.distribute strategy (keras/src/backend/tensorflow/
optimizer.py). Compression, periodic averaging, one-device arithmetic for a custom step and the
step-time clock each wrap it through `wrap`, on the one optimizer `tfdist.fit` or a
`TrainingLoop` built, never on Keras's class; wrappers stack in the order they are installed.

```python
wrap(optimizer, lambda reduce, grads_and_vars: reduce(grads_and_vars))  # a no-op wrapper
```
"""

from __future__ import annotations

import types
from typing import Callable

PRIVATE = "_all_reduce_sum_gradients"


def wrap(optimizer, wrapper: Callable) -> None:
  """Makes `optimizer` reduce its gradients with `wrapper(reduce, grads_and_vars)`, where
  `reduce` is the reduction installed before (Keras's own at first).

  Args:
    optimizer: a built or unbuilt Keras optimizer (not a LossScaleOptimizer: its inner one).
    wrapper: a function of (the previous reduction, a list of (gradient, variable)) returning
      the list of (reduced gradient, variable).
  """
  reduce = getattr(optimizer, PRIVATE)
  setattr(optimizer, PRIVATE, types.MethodType(
      lambda self, grads_and_vars: wrapper(reduce, grads_and_vars), optimizer))
