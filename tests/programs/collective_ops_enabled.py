"""Makes two MultiWorkerMirroredStrategy in one process of a one-worker cluster, as a launched
tutorial script does after tfdist made the task's own, and prints how many times TensorFlow's
runtime enabled collective ops: `plain` (TensorFlow alone) or `tfdist` (tfdist's strategy first).
Usage: collective_ops_enabled.py plain|tfdist PORT"""

import json
import os
import sys

os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{sys.argv[2]}"]},
                                      "task": {"type": "worker", "index": 0}})
import tensorflow as tf  # noqa: E402
from tensorflow.python import pywrap_tfe  # noqa: E402

calls = []
own = pywrap_tfe.TFE_EnableCollectiveOps
pywrap_tfe.TFE_EnableCollectiveOps = lambda *args: (calls.append(1), own(*args))[1]
if sys.argv[1] == "tfdist":
  import tfdist
  tfdist.make_strategy({"strategy": "multi_worker_mirrored"})
else:
  tf.distribute.MultiWorkerMirroredStrategy()
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
  variable = tf.Variable(1.0)
print("ENABLED", len(calls), float(variable.numpy()), flush=True)
