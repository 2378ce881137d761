"""Prints what a Python program sees of its interpreter, then ends as argv[1] says: the
reference for a task forked from `tfdist.machine.preload` is this program run by a fresh
interpreter (tests/test_preload.py)."""

import atexit
import json
import os
import sys
import threading
import time

seen = {
    "argv": sys.argv, "name": __name__, "file": os.path.basename(__file__),
    "path0": sys.path[0], "cwd": os.getcwd(), "stdin": sys.stdin.read(),
    "env": {k: v for k, v in os.environ.items() if k.startswith("FACT_")},
    "tfdist_before_tf": "tfdist" in sys.modules,
    "main_names": sorted(n for n in globals() if not n.startswith("__")),
}
import numpy  # noqa: E402
import tensorflow  # noqa: E402,F401
seen["tfdist_after_tf"] = "tfdist" in sys.modules
seen["tempdir"] = __import__("tempfile").gettempdir()
seen["numpy_draw"] = float(numpy.random.random())
print(json.dumps(seen), flush=True)

left_open = open("left_open.txt", "w")  # Never closed: the exit flushes it.
left_open.write("written before the end")
atexit.register(lambda: print("atexit ran", flush=True))


def late():
  time.sleep(0.5)
  print("thread joined", flush=True)


threading.Thread(target=late).start()
end = sys.argv[1] if len(sys.argv) > 1 else ""
if end == "raise":
  raise ValueError("raised at the end")
if end == "message":
  sys.exit("ended with a message")
if end.isdigit():
  sys.exit(int(end))
