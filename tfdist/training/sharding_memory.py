"""What a replica holds at its step's peak under each ZeRO stage (`training.zero_stage`),
from the unsharded replica's estimate
(`tfdist.parallel.estimate_memory`): the rows `tfdist estimate` prints and recommends from.

Each stage's step holds the replica's whole gradients (the tape returns them whole), then, in
its reduction and update phase (`DeviceMemory.update`), the buffers this package's stages make;
each term below is a buffer TensorFlow's profiler showed alive at a sharded step's peak
(2 and 4 MultiWorkerMirrored workers on CPU, BUILD_NOTES.md):

- stage 1: Keras's all-reduce (its packed buffer and the summed gradients, beside the
  replica's own), the weights' shard and the optimizer's temporaries over it
  (`step_memory.UPDATE_COPIES`), a variable's new value before its assignment, and one
  gathered piece of every replica's shard (`sharded_optimizer.PIECE_BYTES` each);
- stage 2: instead of the all-reduce, the reduced shard (its pieces, then their
  concatenation) and one all-to-all's buffers (sent and received: `PIECE_BYTES` in all);
- stage 3: stage 2's update without writing the weights back (the shard is written whole);
  in the passes, the weights gathered a bucket at a time (`sharded_parameters`: a run of
  weights of `PIECE_BYTES` or more) and each bucket freed once the backward pass is past its
  weights, as their gradients appear: with the whole gradients, a bucket more (and its
  all-reduce's input) in `working`, not the whole weights twice. `working` keeps the unsharded
  step's own too (the update copies of its largest weight where they are more than the
  passes' working memory, `StepTensors.working`): a bound.

```python
plan = estimate_memory(model, batch=256, devices=1, replicas=4)
plan.update(stage_rows(plan))
print(render(plan, capacity=16 << 30))
```
"""

from __future__ import annotations

import dataclasses

from tfdist.parallel.estimates import DeviceMemory
from tfdist.parallel.step_memory import UPDATE_COPIES
from tfdist.training.sharded_optimizer import PIECE_BYTES


def stage_rows(plan: dict) -> dict[str, DeviceMemory]:
  """Each ZeRO stage's `DeviceMemory` per replica, from `plan` (`estimate_memory`'s).

  Args:
    plan: `tfdist.parallel.estimate_memory`'s plan ("data_parallel", "replicas", "trainable",
      "largest").

  Returns:
    {"sharded": stage 1, "sharded_gradients": stage 2, "sharded_parameters": stage 3}; empty
    for one replica or a model with nothing trainable (nothing to shard).

  Example:

  ```python
  plan = estimate_memory(model, batch=256, devices=1, replicas=4)
  rows = stage_rows(plan)
  rows["sharded_parameters"].total < plan["data_parallel"].total
  ```
  """
  whole, replicas = plan["data_parallel"], plan["replicas"]
  trainable, largest = plan["trainable"], plan["largest"]
  if replicas < 2 or not trainable:
    return {}
  shard = -(-trainable // replicas)
  optimizer = int(round(whole.optimizer * shard / trainable))
  gathered_piece = replicas * min(PIECE_BYTES, shard)  # Stages 1-2 write back in pieces.
  scattered_piece = 2 * min(PIECE_BYTES, shard * replicas)  # Sent, and received.
  update_shard = shard + UPDATE_COPIES * shard  # The weights' shard, the optimizer's copies.
  write_back = largest + gathered_piece
  stage_1 = dataclasses.replace(
      whole, optimizer=optimizer,
      update=2 * whole.gradients + update_shard + write_back)
  stage_2 = dataclasses.replace(
      stage_1, update=2 * shard + scattered_piece + update_shard + write_back)
  bucket = min(trainable, largest + PIECE_BYTES)  # A bucket closes at PIECE_BYTES or more.
  stage_3 = dataclasses.replace(
      stage_2, weights=whole.weights - trainable + shard, working=whole.working + 2 * bucket,
      update=2 * shard + scattered_piece + update_shard)
  return {"sharded": stage_1, "sharded_gradients": stage_2, "sharded_parameters": stage_3}
