"""Detector: does TensorFlow hold the GIL while a MultiWorkerMirroredStrategy connects to a
cluster whose peer is not up? A thread prints `TICK` every 0.1 s; the main thread prints
`CONNECTING` and makes the strategy (worker-1 never starts, so it waits). The test reads the
lines after `CONNECTING`: none while the GIL is held. (The launcher's supervisor does not judge
heartbeats during start-up because of it.)"""

import json
import os
import sys
import threading
import time

os.environ["TF_CONFIG"] = json.dumps({
    "cluster": {"worker": [f"127.0.0.1:{sys.argv[1]}", f"127.0.0.1:{sys.argv[2]}"]},
    "task": {"type": "worker", "index": 0}})
import tensorflow as tf  # noqa: E402  (after TF_CONFIG)


def tick():
  while True:
    print("TICK", flush=True)
    time.sleep(0.1)


threading.Thread(target=tick, daemon=True).start()
time.sleep(0.5)
print("CONNECTING", flush=True)
tf.distribute.MultiWorkerMirroredStrategy()
print("MADE", flush=True)
