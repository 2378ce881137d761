"""What tfdist does to a launched script that trains its own way, as TensorFlow's and Keras's
guides write it: its own strategy (`own_strategy`), Keras's own `model.fit` with its callbacks,
`model.save` on every worker then `load_model` (`save_order`), Keras's own fit of a
parameter-server model (`parameter_servers`).

Installed once at a launched task's `import tfdist` (the launcher's `TFDIST_PREPARE`), after the
task's strategy was made.
"""

from __future__ import annotations

import functools
import inspect
import sys

from tfdist.config import strategies
from tfdist.config.schema import Config
from tfdist.launched import own_strategy, parameter_servers, save_order


def install(config: Config) -> None:
  """Installs, in a launched task, what tfdist does to a script with its own strategy.

  Args:
    config: the task's config.

  Example:

  ```python
  launched.install(tfdist.load_config())   # `import tfdist` does, in a launched task
  ```
  """
  own_strategy.install(config, lambda line: print(line, file=sys.stdout, flush=True))
  kind = strategies.kind(config.strategy.name)
  if kind.asynchronous:
    parameter_servers.install()
  elif kind.across_workers and config.cluster.training_tasks > 1:
    save_order.install(config)
    _callbacks_write_once(config)


def _callbacks_write_once(config: Config) -> None:
  """Keras's own `fit` in a worker of a cluster: the files its callbacks write (ModelCheckpoint,
  CSVLogger, TensorBoard) are the chief's alone, the others' go to a temporary directory;
  BackupAndRestore gets a folder per task (every worker writing one `backup_dir` failed with
  `FileExistsError` at the first epoch's end), as tf-keras's distributed_file_utils did and as
  `tfdist.fit` does (`user_files.chief_only`)."""
  import keras
  from tfdist.training import keras_fixes, user_files
  fit = keras.Model.fit
  if getattr(fit, "tfdist_files_once", False):
    return

  @functools.wraps(fit)
  def fit_writing_once(model, *args, **kwargs):
    given = inspect.signature(fit).bind(model, *args, **kwargs)
    callbacks = given.arguments.get("callbacks")
    if keras_fixes.fixing() or not callbacks:  # tfdist.fit's own call: prepared there.
      return fit(model, *args, **kwargs)
    with user_files.chief_only(callbacks, config) as once:
      given.arguments["callbacks"] = once
      return fit(*given.args, **given.kwargs)
  fit_writing_once.tfdist_files_once = True
  keras.Model.fit = fit_writing_once
