"""Model parallelism: one model split over devices (placement, pipelining, tensor parallel,
hybrid with data parallelism across workers) and the memory planner.

```python
from tfdist.parallel import split
split(model, "balanced", devices=["/device:GPU:0", "/device:GPU:1"], microbatches=4)
```
"""

from tfdist.parallel.split_model import split  # noqa: F401  (the public entry point)
