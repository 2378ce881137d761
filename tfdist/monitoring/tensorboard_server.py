"""TensorBoard's own server on a run's logs, as a child process bound to 127.0.0.1 unless
asked (it dies with the process that started it).

```python
url, stop = start_tensorboard("/shared/logs")
print(url)          # http://127.0.0.1:<free port>/
stop()
```
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from typing import Callable

from tfdist.machine.children import start_as_child
from tfdist.machine.ports import accepts


def start_tensorboard(log_dir: str, *, port: int = 0, bind_all: bool = False,
                      timeout: float = 60) -> tuple[str, Callable[[], None]]:
  """Starts TensorBoard (`python -m tensorboard.main`) on `log_dir`; returns its URL once it
  answers, and a function that stops it.

  Args:
    log_dir: the directory of runs (`tensorboard.log_dir`) or one run.
    port: the port; 0 picks a free one.
    bind_all: listen on every interface instead of 127.0.0.1.
    timeout: seconds for it to come up.

  Raises:
    RuntimeError: it exited or did not answer in time (its output is in the message).
  """
  import portpicker

  port = port or portpicker.pick_unused_port()
  host = ["--bind_all"] if bind_all else ["--host", "127.0.0.1"]
  output = tempfile.TemporaryFile()  # Not a pipe: nobody reads it while TensorBoard runs.
  server = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", log_dir,
                             "--port", str(port), *host], stdout=output, stderr=output,
                            stdin=subprocess.DEVNULL, preexec_fn=start_as_child,
                            # Out of the terminal's process group: Ctrl-C's SIGINT hangs
                            # TensorBoard (measured: no exit in 10 s); our SIGTERM stops it in
                            # ~1.5 s.
                            start_new_session=True)
  deadline = time.monotonic() + timeout
  while not accepts(f"127.0.0.1:{port}"):
    if server.poll() is not None or time.monotonic() > deadline:
      server.kill()
      server.wait()
      output.seek(0)
      raise RuntimeError(f"TensorBoard did not start on port {port}: "
                         f"{output.read().decode(errors='replace')[-2000:]}")
    time.sleep(0.2)

  def stop() -> None:
    server.terminate()
    try:
      server.wait(timeout=10)
    except subprocess.TimeoutExpired:
      server.kill()
      server.wait()
    output.close()
  return f"http://{'0.0.0.0' if bind_all else '127.0.0.1'}:{port}/", stop


def required_log_dir(config, purpose: str) -> str:
  """The config's `tensorboard.log_dir`; a ConfigError naming `purpose` when it is not set."""
  from tfdist.errors import ConfigError
  if not config.tensorboard.log_dir:
    raise ConfigError(f"must be set {purpose}", key="tensorboard.log_dir",
                      source=config.source)
  return config.tensorboard.log_dir
