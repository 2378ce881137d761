"""A task that dies of a signal in its own code (`DIE=segv`: SIGSEGV, as a native crash) or
exits with nothing written (`DIE=silent`)."""

import os
import signal


def die_here():
  if os.environ.get("DIE") == "silent":
    os._exit(3)
  os.kill(os.getpid(), signal.SIGSEGV)


die_here()
