"""What runs inside the Ray actor of one task (`tfdist launch --backend ray`): the task's
process started on the actor's node as the local backend starts it (a session of its own, dying
with its parent: here the actor), its output and heartbeat handed to the launcher on request,
signals sent to it. Imported by Ray's workers; it does not import Ray itself.

```python
actor = ray.remote(TaskActor).remote()
address = ray.get(actor.node.remote())              # ("10.0.0.5", 41233)
pid = ray.get(actor.start.remote(argv, env, files, cwd, python))
output, beat, age, code = ray.get(actor.follow.remote())
```
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

_FOLLOW_WAIT = 0.5  # Seconds a `follow` call waits for output before it answers.
_FOLLOW_BYTES = 1 << 16


class TaskActor:
  """The actor of one task of a Ray launch: started once, it runs the task's process (again
  after each restart)."""

  def __init__(self):
    self._dir = tempfile.mkdtemp(prefix="tfdist-ray-task-")
    self._process: subprocess.Popen | None = None
    self._output: queue.Queue = queue.Queue()
    self._heartbeat = os.path.join(self._dir, "heartbeat")
    self._ended = threading.Event()
    self._held = None  # The task's port (`node`).

  def node(self) -> tuple[str, int]:
    """This node's address and a port free on it, the task's server address: the port picked
    at the first call and held by this actor for its life (`HeldPorts`: no other program on
    the node binds it meanwhile, TensorFlow's server still can). Picked and let go, it was
    taken once before the task's server started ("Could not start gRPC server", three test
    processes on 2 cores, 2026-11-28)."""
    import ray
    from tfdist.machine.ports import HeldPorts
    if self._held is None:
      self._held = HeldPorts(1)
    return ray.util.get_node_ip_address(), self._held.ports[0]

  def start(self, argv, env, files, cwd: str, python: str, heartbeat_env: str) -> int:
    """Starts the task's process; returns its pid on this node.

    Args:
      argv: its command; an `argv[0]` equal to `python` (the launcher's interpreter: the
        parameter-server servers) becomes this node's.
      env: its variables, on top of this actor's environment (Ray's runtime env).
      files: {path: text} the command needs (the config): a path this node lacks is written
        into the actor's folder and replaced in `argv` and `env`.
      cwd: the launcher's working directory, used where this node has it; else the actor's
        (Ray's runtime env `working_dir`).
      python: the launcher's interpreter.
      heartbeat_env: the variable naming the heartbeat file, which is moved into the actor's
        folder (`follow` hands it to the launcher).
    """
    from tfdist.machine import children
    moved = {}
    for path, text in files.items():
      if not os.path.exists(path):
        moved[path] = os.path.join(self._dir, os.path.basename(path))
        with open(moved[path], "w") as out:
          out.write(text)
    argv = [sys.executable if i == 0 and a == python else moved.get(a, a)
            for i, a in enumerate(argv)]
    env = {key: moved.get(value, value) for key, value in dict(env).items()}
    env[heartbeat_env] = self._heartbeat
    if os.path.exists(self._heartbeat):
      os.remove(self._heartbeat)  # An earlier start's.
    self._output, self._ended = queue.Queue(), threading.Event()
    self._process = subprocess.Popen(
        argv, env={"TF_CPP_MIN_LOG_LEVEL": "2", **os.environ, **env},
        cwd=cwd if os.path.isdir(cwd) else None, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=children.start_as_child)
    threading.Thread(target=self._read, args=(self._process, self._output, self._ended),
                     daemon=True).start()
    return self._process.pid

  @staticmethod
  def _read(process, output, ended) -> None:
    for line in iter(process.stdout.readline, b""):
      output.put(line)
    process.wait()
    ended.set()

  def follow(self) -> tuple[bytes, str | None, float | None, int | None]:
    """Waits up to half a second for output; returns (the output since the last call, the
    heartbeat file's text, its age in seconds, the exit code once the process has ended and
    all its output was handed over, else None)."""
    chunks, size = [], 0
    deadline = time.monotonic() + _FOLLOW_WAIT
    while size < _FOLLOW_BYTES:
      try:
        chunk = self._output.get(timeout=max(deadline - time.monotonic(), 0) if not chunks
                                 else 0)
      except queue.Empty:
        break
      chunks.append(chunk)
      size += len(chunk)
    beat = age = None
    try:
      with open(self._heartbeat) as f:
        beat, age = f.read(), time.time() - os.stat(self._heartbeat).st_mtime
    except OSError:
      pass
    done = self._ended.is_set() and self._output.empty()
    return b"".join(chunks), beat, age, self._process.returncode if done else None

  def signal(self, signum: int, group: bool) -> None:
    """Sends `signum` to the process (`group`: to its whole process group)."""
    if self._process is None or (self._process.poll() is not None and not group):
      return
    try:
      if group:
        os.killpg(self._process.pid, signum)
      else:
        os.kill(self._process.pid, signum)
    except (ProcessLookupError, PermissionError):
      pass

  def kill(self) -> None:
    """SIGKILLs the process group (the actor is killed next: its process dies with it) and
    removes the actor's folder (its heartbeat, the files it wrote)."""
    self.signal(signal.SIGKILL, group=True)
    shutil.rmtree(self._dir, ignore_errors=True)
