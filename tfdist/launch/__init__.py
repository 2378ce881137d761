"""`tfdist launch`, as a library: a cluster's backend (backends/), its processes planned as data
(plan.py), then started and supervised (supervisor.py), in one call.

```python
from tfdist.launch import LaunchOptions, launch
outcome = launch("configs/multi_worker_mirrored.yaml", ["python", "train.py"],
                 LaunchOptions(max_restarts=1))
```
"""

from tfdist.launch.launcher import LaunchOptions, launch

__all__ = ["LaunchOptions", "launch"]
