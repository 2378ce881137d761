"""Model parallelism: one model split over devices (placement, pipelining, tensor parallel,
hybrid with data parallelism across workers), and the memory each way needs.

Takes: a built Keras model and devices. Gives: the same model, its layers placed by stage,
equal to the unsplit one (1e-5); estimates of each device's bytes (`estimates.py`,
`step_memory.py`). Never imports: `training` (which splits through it), `launch`, `cli`.

```python
from tfdist.parallel import split
split(model, "balanced", devices=["/device:GPU:0", "/device:GPU:1"], microbatches=4)
```
"""

from tfdist.parallel.estimates import estimate_generation, estimate_memory
from tfdist.parallel.split_model import split

__all__ = ["estimate_generation", "estimate_memory", "split"]
