"""TensorFlow's start-up banners, and a stderr that leaves them out.

absl prints them before `TF_CPP_MIN_LOG_LEVEL` applies ("All log messages before
absl::InitializeLog() is called are written to STDERR"), and TensorFlow 2.21 prints its oneDNN
notice twice per process (at import and when the runtime starts). They say nothing a user of a
command needs.

```python
with stderr_without_banners():
  import tensorflow as tf      # no banner on the terminal
```
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading

BANNERS = re.compile(rb"All log messages before absl::InitializeLog|oneDNN custom operations|"
                     rb"cpu_feature_guard|To enable the following instructions")


@contextlib.contextmanager
def stderr_without_banners():
  """File descriptor 2 (Python's, TensorFlow's C++ logs, child processes') goes through a filter
  that drops `BANNERS` lines and passes every other line on at once, while inside."""
  sys.stderr.flush()
  terminal = os.dup(2)
  read_end, write_end = os.pipe()
  os.dup2(write_end, 2)
  os.close(write_end)

  def pump():
    with os.fdopen(read_end, "rb", buffering=0) as lines:
      for line in iter(lines.readline, b""):
        if not BANNERS.search(line):
          os.write(terminal, line)
  thread = threading.Thread(target=pump, name="tfdist-stderr", daemon=True)
  thread.start()
  try:
    yield
  finally:
    sys.stderr.flush()
    os.dup2(terminal, 2)  # Closes the pipe's last write end this process holds.
    thread.join(timeout=5)
    os.close(terminal)
