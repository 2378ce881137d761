"""tfdist: Keras models trained under tf.distribute strategies, configured in one YAML file.

```python
import tfdist

config = tfdist.load_config("configs/mirrored.yaml")
strategy = tfdist.make_strategy(config)
```

Importing tfdist does not import TensorFlow, except in a process `tfdist launch` started to run
the user's command: there it makes that task's strategy at once (`tfdist.strategy.startup`), so
the script may build its data before calling `tfdist.fit`.
"""

from tfdist.config import BatchSizes, Config, batch_sizes, load_config, replica_count
from tfdist.config.roles import is_chief, task
from tfdist.config.tf_config import tf_config_for
from tfdist.errors import (ConfigError, DeviceSetupError, MissingExtraError, ModelError,
                           TfdistError, UnsupportedError)
from tfdist.launch.liveness import start_from_environment as _beat
from tfdist.strategy import (central_storage, cluster_resolver, configure_devices, default,
                             make_strategy, mirrored, multi_worker_mirrored, one_device,
                             parameter_server, serve, start_server)
from tfdist.strategy.startup import prepare_from_environment as _prepare
from tfdist.training.fit import evaluate, fit, global_batch_size, predict

__version__ = "0.1.0"

_beat()  # A launched task tells its launcher it is alive, even while the strategy waits.
_prepare()  # A launched task's strategy, before the script can start TensorFlow.


def __getattr__(name: str):
  # `tfdist.TrainingLoop` imports TensorFlow: only when asked for, not at `import tfdist`.
  if name == "TrainingLoop":
    from tfdist.training.loop import TrainingLoop
    return TrainingLoop
  raise AttributeError(f"module 'tfdist' has no attribute {name!r}")
