"""Inference: fast bulk prediction, request batching, an HTTP endpoint, SavedModel export.

```python
from tfdist.serving import BatchingPredictor
predictor = BatchingPredictor(model, max_batch_size=32, max_wait_ms=2)
```
"""

from tfdist.serving.batching import BatchingPredictor, DeadlineExceeded, QueueFull
from tfdist.serving.saved_model import export_for_serving

__all__ = ["BatchingPredictor", "DeadlineExceeded", "QueueFull", "export_for_serving"]
