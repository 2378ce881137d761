"""A task of a 2-worker MultiWorkerMirrored cluster that all-reduces forever, printing
`PID <pid>` once and `STEP <n>` every 50 steps, with a colour code and a progress bar's carriage
return in its first line (for the plain-text log test). With STEPS=N it stops after N steps."""

import os
import sys

import tensorflow as tf

import tfdist

strategy = tfdist.make_strategy()
print(f"\x1b[1mPID {os.getpid()}\x1b[0m\r\x08", flush=True)
limit = int(os.environ.get("STEPS", "0"))


@tf.function
def step():
  context = tf.distribute.get_replica_context()
  return context.all_reduce("sum", tf.constant(1.0))


n = 0
while not limit or n < limit:
  strategy.run(step)
  n += 1
  if n % 50 == 0:
    print(f"STEP {n}", flush=True)
sys.exit(0)
