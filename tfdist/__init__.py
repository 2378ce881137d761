"""tfdist: Keras models trained under tf.distribute strategies, configured in one YAML file.

```python
import tfdist

config = tfdist.load_config("configs/mirrored.yaml")
strategy = tfdist.make_strategy(config)
```

Importing tfdist does not import TensorFlow, except in a process `tfdist launch` started to run
the user's command: there it makes that task's strategy at once (`tfdist.strategy.startup`), so
the script may build its data before calling `tfdist.fit`, and runs Keras's own fit, evaluate
and predict inside tfdist's Keras 3 fixes (`tfdist.training.keras_fixes.install`). A launched
script that never imports tfdist gets the same when TensorFlow is imported
(`tfdist/script_hook`).
"""

import warnings

from tfdist.config import BatchSizes, Config, batch_sizes, load_config, replica_count
from tfdist.config.roles import is_chief, task
from tfdist.config.tf_config import tf_config_for
from tfdist.data_service import data_service_address
from tfdist.errors import (ConfigError, DeviceSetupError, MissingExtraError, ModelError,
                           TfdistError, UnsupportedError)
from tfdist.errors import report_in_one_line as _report_in_one_line
from tfdist.launch.liveness import start_from_environment as _beat
from tfdist.strategy import (central_storage, cluster_resolver, configure_devices, default,
                             make_strategy, mirrored, multi_worker_mirrored, one_device,
                             parameter_server, run_cluster_server, start_cluster_server)
from tfdist.strategy.startup import prepare_from_environment as _prepare
from tfdist.training.fit import evaluate, fit, global_batch_size, predict
from tfdist.training.keras_distribution import use_keras_distribution

__version__ = "0.1.0"
__all__ = [
    "BatchSizes", "Config", "ConfigError", "DeviceSetupError", "MissingExtraError", "ModelError",
    "TfdistError", "TrainingLoop", "UnsupportedError", "batch_sizes", "central_storage",
    "cluster_resolver", "configure_devices", "data_service_address", "default", "evaluate", "fit",
    "global_batch_size",
    "is_chief", "load_config", "make_strategy", "mirrored", "multi_worker_mirrored",
    "one_device", "parameter_server", "predict", "replica_count", "run_cluster_server",
    "start_cluster_server", "task", "tf_config_for", "use_keras_distribution",
]
"""The public API; `tfdist.launch.launch` launches a cluster from a program (`tfdist.launch` is
the package of the launcher)."""

_RENAMED = {"serve": "run_cluster_server", "start_server": "start_cluster_server"}
"""Old names, kept for this release (0.1) with a DeprecationWarning; gone in the next."""

if _beat():  # A launched task tells its launcher it is alive, even while the strategy waits,
  _report_in_one_line()  # and says a refusal of tfdist's in one line.
if _prepare():  # A launched task's strategy, before the script can start TensorFlow,
  from tfdist import launched as _launched
  from tfdist.training.keras_fixes import install as _install_keras_fixes
  _install_keras_fixes()  # Keras's own fit/evaluate/predict fixed under it,
  _launched.install(load_config())  # and a script's own strategy, files and saves.


def __getattr__(name: str):
  # `tfdist.TrainingLoop` imports TensorFlow: only when asked for, not at `import tfdist`.
  if name == "TrainingLoop":
    from tfdist.training.loop import TrainingLoop
    return TrainingLoop
  if name in _RENAMED:
    warnings.warn(f"tfdist.{name} is now tfdist.{_RENAMED[name]}; the old name goes in the next "
                  "release", DeprecationWarning, stacklevel=2)
    return globals()[_RENAMED[name]]
  raise AttributeError(f"module 'tfdist' has no attribute {name!r}")
