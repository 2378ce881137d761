"""A launch's side of the preloaded server, alone: forks `python SLEEPER` through
`preload.Preloaded` with this process's environment (`TFDIST_PRELOAD_SERVER` naming a shared
server or not), prints `shared` (whether the shared one forked it), why not (`declined`) and
the task's pid, then waits for the task. Run by tests/test_preload.py, which kills it or
limits it."""

import json
import os
import sys

from tfdist.machine import preload

client = preload.Preloaded()
task = client.start([sys.executable, sys.argv[1]], dict(os.environ))
print(json.dumps({"shared": client.shared, "declined": client.declined, "task": task.pid}),
      flush=True)
print(task.stdout.readline().decode().strip(), flush=True)
task.wait()
client.close()
