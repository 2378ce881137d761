"""The strategy of a launched task, made when tfdist is imported: before the user's script can
start TensorFlow's runtime.

MultiWorkerMirroredStrategy and logical CPU devices must be set up before TensorFlow starts its
runtime, and an ordinary script starts it first: `tfdist.fit(make_model, make_dataset(), ...)`
builds the dataset before `fit` runs. `tfdist launch` marks each process that runs the user's
command with `TFDIST_PREPARE=1`; importing tfdist there makes the config's strategy at once
(`tfdist.fit` later finds the same one made) and removes the mark, so the script's own child
processes do not make another.
"""

from __future__ import annotations

import os
from typing import MutableMapping

from tfdist.config.loader import PREPARE_ENV


def prepare_from_environment(environ: MutableMapping[str, str] = os.environ) -> bool:
  """Makes the launched task's strategy now, if the launcher asked; returns whether it did.

  A parameter-server chief's strategy connects to the cluster, which resets TensorFlow's
  runtime: a dataset made before it is lost ("CPU:0 unknown device"), so it too is made first.

  Raises:
    DeviceSetupError: TensorFlow ran before tfdist was imported; the message says what to move.

  ```python
  # In a process started by `tfdist launch CONFIG -- python train.py`:
  import tfdist                 # makes the strategy of this task
  dataset = make_dataset()      # TensorFlow starts here, after the strategy
  ```
  """
  if environ.pop(PREPARE_ENV, None) != "1":
    return False
  from tfdist.config.loader import load_config
  from tfdist.strategy.factory import make_strategy

  make_strategy(load_config(None, environ=environ))
  return True
