"""tfdist: Keras models trained under tf.distribute strategies, configured in one YAML file.

```python
import tfdist

config = tfdist.load_config("configs/mirrored.yaml")
strategy = tfdist.make_strategy(config)
```

Importing tfdist does not import TensorFlow; the functions that need it import it when called.
"""

from tfdist.config import BatchSizes, Config, batch_sizes, load_config, replica_count
from tfdist.config.tf_config import tf_config_for
from tfdist.errors import ConfigError, DeviceSetupError, TfdistError
from tfdist.strategy import (central_storage, cluster_resolver, configure_devices, default,
                             make_strategy, mirrored, multi_worker_mirrored, one_device,
                             parameter_server, serve, start_server)

__version__ = "0.1.0"
from tfdist.training.fit import evaluate, fit, predict
