"""Inference: fast bulk prediction, request batching, an HTTP endpoint, SavedModel export.

Takes: a Keras model, a `.keras` file or a SavedModel. Gives: predictions in input order,
batched requests, TF Serving's REST surface (`http.py`, the `serving` extra), a SavedModel for
TF Serving. Never imports: `training`, `launch`, `cli`.

```python
from tfdist.serving import BatchingPredictor
predictor = BatchingPredictor(model, max_batch_size=32, max_wait_ms=2)
```
"""

from tfdist.serving.batching import BatchingPredictor, DeadlineExceeded, QueueFull
from tfdist.serving.saved_model import export_for_serving

__all__ = ["BatchingPredictor", "DeadlineExceeded", "QueueFull", "export_for_serving"]
