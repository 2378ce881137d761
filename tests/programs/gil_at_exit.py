"""A script that ends at once on worker-1 and works 15 s more on worker-0 (its own end, as a
chief saving a model): worker-1 waits for it in tfdist's exit barrier, where TensorFlow's
coordination service holds the GIL. A thread of worker-1 prints `TICK` every 0.2 s; the test
counts those printed inside the wait (none while the GIL is held: the detector), and the
launcher must not take the silent heartbeat for a frozen task."""

import threading
import time

import tfdist

config = tfdist.load_config()
strategy = tfdist.make_strategy(config)
if config.task.index == 0:
  time.sleep(15)
else:
  def tick():
    while True:
      print(f"TICK {time.time():.2f}", flush=True)
      time.sleep(0.2)
  threading.Thread(target=tick, daemon=True).start()
  print(f"WAITING {time.time():.2f}", flush=True)
