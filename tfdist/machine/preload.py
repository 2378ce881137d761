"""Python tasks started by forking one process that imported TensorFlow and Keras once (a fork
server: `multiprocessing`'s forkserver with `set_forkserver_preload`, Android's zygote).

`import tensorflow` with Keras costs 4-5 CPU-seconds and Python's teardown of it 1-2 more, in
every task and again in every restart; a task forked from a process that already imported them
starts in milliseconds and shares those pages. A forked task is the command's own program:
`python SCRIPT ARGS` or `python -m MODULE ARGS`, run as `__main__` with its own arguments,
environment, working directory, `sys.path`, output pipe, session and random seeds, tfdist's
script hook applied as a fresh interpreter applies it (`tfdist/script_hook`: tfdist is imported
when the script first imports TensorFlow or Keras), its threads joined and its `atexit`
functions run at the end; only the interpreter's teardown of the modules is skipped (the
script's own globals are released first, so a file it never closed is flushed).

A command that is not such a program (another interpreter, `python -c`, interpreter options, a
shell), or whose environment differs from the preloaded one in more than the per-task variables
(`PER_TASK`: read after the import), starts as its own process, as without preloading.

A server is a launch's own (its child, ended with it) or shared by many launches (`Shared`,
found at `TFDIST_PRELOAD_SERVER`: a test suite that launches hundreds of times imports
TensorFlow once per test process, not once per launch). A shared server forks a launch's task
only where the task would be the same as one its launch forked itself: the same environment but
for the per-task variables, the same namespaces, control groups, resource limits, user and CPU
affinity (`context`), else the launch starts its own server; a launch's tasks are killed when its
connection closes (the launcher ended or died), as its own server's tasks die with it.

The server runs this file as a script (`serve`): it never imports tfdist, so a task imports
tfdist itself as its own interpreter would. Takes: nothing of tfdist's. Never imports: any room.

```python
from tfdist.machine import preload
server = preload.Preloaded()
task = server.start(["python", "train.py"], env, cwd=".")   # a Popen-like, or None
task.wait(); server.close()
```
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Mapping, Sequence

PER_TASK = ("TF_CONFIG", "CUDA_VISIBLE_DEVICES", "TF_FORCE_GPU_ALLOW_GROWTH", "PYTHONPATH",
            "TMPDIR")
"""Variables a forked task may have of its own: TensorFlow reads them after its import (the
cluster, the GPUs at the runtime's start, TMPDIR at each call), `sys.path` is made from
PYTHONPATH per task, and Python's `tempfile` forgets the folder the import cached. So may every
`TFDIST_` variable (tfdist is imported in the task)."""

UNREAD = ("PYTEST_CURRENT_TEST",)
"""Variables that may differ because no import reads them (pytest's name of the running test,
which changes with each test while a shared server lives)."""

SHARED_ENV = "TFDIST_PRELOAD_SERVER"
"""The socket path of a `Shared` server; a launch whose first task's environment has it forks
its tasks there when it may (`Preloaded.start`)."""

_HOOKED = ("tensorflow", "keras")
_PREPARE_ENV = "TFDIST_PREPARE"  # `tfdist.config.loader.PREPARE_ENV`, named here: no import.
_MESSAGE = 1 << 20
_JOIN_S = 120  # A shared server's import on a busy machine; then this launch starts its own.


def forkable(argv: Sequence[str], env: Mapping[str, str], python: str = sys.executable) -> bool:
  """Whether `argv` is `python SCRIPT ...`, `python -u SCRIPT ...` or `python -m MODULE ...` run
  by `python` itself (a preloaded server can start it). Pure but for `PATH` lookups.

  >>> forkable(["python3", "-c", "print(1)"], {})
  False
  """
  if len(argv) < 2:
    return False
  found = shutil.which(argv[0], path=env.get("PATH")) if os.sep not in argv[0] else argv[0]
  if not found or os.path.realpath(found) != os.path.realpath(python):
    return False
  rest = list(argv[1:])
  if rest[0] == "-u":
    rest = rest[1:]
  if rest[:1] == ["-m"]:
    return len(rest) > 1
  return bool(rest) and not rest[0].startswith("-")


def same_but_per_task(env: Mapping[str, str], preloaded: Mapping[str, str],
                      imported: Mapping[str, str] | None = None) -> bool:
  """Whether `env` differs from the preloaded server's `preloaded` environment only in
  `PER_TASK`, `UNREAD` and `TFDIST_` variables, and in those its import of TensorFlow set
  (`imported`: `TF2_BEHAVIOR`, `KMP_INIT_AT_FORK`, ...), which `env` may have as set. Pure.

  >>> same_but_per_task({"TF2_BEHAVIOR": "1"}, {}, imported={"TF2_BEHAVIOR": "1"})
  True
  """
  return not differing(env, preloaded, imported)


def differing(env: Mapping[str, str], preloaded: Mapping[str, str],
              imported: Mapping[str, str] | None = None,
              also_per_task: Sequence[str] = ()) -> list[str]:
  """The variables for which `same_but_per_task` fails, sorted; `also_per_task`: more names
  that may differ (a `Shared` server's `per_task`). Pure."""
  imported = imported or {}
  keys = {k for k in set(env) | set(preloaded) if k not in (*PER_TASK, *UNREAD, *also_per_task)
          and not k.startswith("TFDIST_")}
  return sorted(k for k in keys if not (env.get(k) in (None, imported[k]) if k in imported
                                        else env.get(k) == preloaded.get(k)))


class ForkedTask:
  """A task forked by the server, with the surface of `subprocess.Popen` a launch uses: `pid`,
  `stdout`, `returncode`, `poll`, `wait`, `send_signal`, `terminate`, `kill`."""

  def __init__(self, pid: int, stdout, ended: threading.Condition):
    self.pid, self.stdout, self.returncode = pid, stdout, None
    self._ended = ended

  def poll(self) -> int | None:
    return self.returncode

  def wait(self, timeout: float | None = None) -> int:
    with self._ended:
      if not self._ended.wait_for(lambda: self.returncode is not None, timeout):
        raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
    return self.returncode

  def send_signal(self, signum: int) -> None:
    if self.returncode is None:
      with contextlib.suppress(ProcessLookupError):
        os.kill(self.pid, signum)

  def terminate(self) -> None:
    self.send_signal(signal.SIGTERM)

  def kill(self) -> None:
    self.send_signal(signal.SIGKILL)


def context() -> dict:
  """What a forked task inherits from its server, not from the launch that asked for it, and
  must be the launch's: the interpreter, user, namespaces, control groups, resource limits,
  CPU affinity and umask, as JSON would carry them. Pure but for reading this process."""
  import resource
  namespaces = {}
  for name in ("net", "mnt", "pid", "ipc", "uts", "user", "cgroup"):
    with contextlib.suppress(OSError):
      namespaces[name] = os.stat(f"/proc/self/ns/{name}").st_ino
  try:
    with open("/proc/self/cgroup") as f:
      cgroups = f.read()
  except OSError:
    cgroups = ""
  mask = os.umask(0)
  os.umask(mask)
  return json.loads(json.dumps({
      "python": os.path.realpath(sys.executable), "ids": [os.getuid(), os.getgid(),
                                                          sorted(os.getgroups())],
      "namespaces": namespaces, "cgroups": cgroups, "umask": mask,
      "affinity": sorted(os.sched_getaffinity(0)),
      "limits": {name: resource.getrlimit(getattr(resource, name))
                 for name in sorted(dir(resource)) if name.startswith("RLIMIT_")}}))


class Preloaded:
  """A fork server with TensorFlow and Keras imported: the `Shared` one the first task's
  environment names (`SHARED_ENV`) where it may fork this launch's tasks, else one of this
  launch's own, started at its first `start` with the environment of that task (less its
  `PER_TASK` variables). Ended by `close` or with this process: its tasks die with it."""

  def __init__(self, python: str = sys.executable):
    self._python = python
    self._lock = threading.Lock()  # One request at a time on the socket.
    self._ended = threading.Condition()
    self._tasks: dict[int, ForkedTask] = {}
    self._replies: list = []
    self._server = self._socket = None
    self._alive = False
    self._env: dict[str, str] | None = None
    self._imported: dict[str, str] = {}
    self._per_task: tuple[str, ...] = ()
    self.failed = False
    self.shared = False
    self.declined: str | None = None
    """Why the shared server could not fork this launch's tasks: the context's parts and the
    variables that differ (see `differing`); None where it could, or none was named."""

  def start(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None,
            stdout: int | None = None, stderr: int | None = None,
            own_server: bool = True) -> ForkedTask | None:
    """Forks `argv` with `env` from the server (started now if not yet).

    Args:
      argv: the command; see `forkable`.
      env: its whole environment.
      cwd: its working directory; None: this process's.
      stdout: a file descriptor for its output; None: a pipe, the task's `stdout`.
      stderr: a file descriptor for its errors; None: its output's.
      own_server: whether to start a server of this launch's own where the shared one is not
        named or declines (else None: start it as a process).

    Returns:
      The `ForkedTask`, or None where this command cannot be forked (start it as a process):
      not `forkable`, an environment that differs (`same_but_per_task`), or a server that
      failed to start (said once on stderr).
    """
    env = dict(env)
    if self.failed or not forkable(argv, env, self._python):
      return None
    with self._lock:
      if self._socket is None and not self._join(env.get(SHARED_ENV), env):
        if not own_server:
          return None
        self._open(env)
      if differing(env, self._env, self._imported, self._per_task):
        return None
      read, write = os.pipe() if stdout is None else (None, stdout)
      try:
        request = json.dumps({"argv": list(argv), "env": env,
                              "cwd": os.path.abspath(cwd or os.getcwd())}).encode()
        with self._ended:
          self._replies.clear()
        try:
          socket.send_fds(self._socket, [request], [write, *([] if stderr is None else [stderr])])
        except OSError:
          return self._gone("its socket closed")
      finally:
        if read is not None:
          os.close(write)
      with self._ended:
        self._ended.wait_for(lambda: self._replies or not self._alive)
        reply = self._replies.pop() if self._replies else {"error": "the server ended"}
      if "pid" not in reply:
        if read is not None:
          os.close(read)
        return self._gone(reply["error"])
      task = ForkedTask(reply["pid"], None if read is None else os.fdopen(read, "rb"),
                        self._ended)
      with self._ended:
        self._tasks[task.pid] = task
        self._ended.notify_all()
      return task

  def close(self) -> None:
    """Ends this launch's server, or its connection to a shared one (its tasks were stopped by
    their launch; any left die with it)."""
    if self._socket is None:
      return
    with contextlib.suppress(OSError):
      self._socket.shutdown(socket.SHUT_RDWR)
    self._socket.close()
    if self._server is None:
      return
    try:
      self._server.wait(timeout=5)
    except subprocess.TimeoutExpired:
      self._server.kill()
      self._server.wait()

  def _join(self, path: str | None, env: dict[str, str]) -> bool:
    """Connects to the shared server at `path` if it may fork these tasks (its environment
    and `context` are theirs); waits out its import, at most `_JOIN_S`."""
    if not path:
      return False
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
      sock.settimeout(_JOIN_S)
      sock.connect(path)
      hello = json.loads(sock.recv(_MESSAGE) or b"{}")
      sock.settimeout(None)
    except (OSError, ValueError):
      sock.close()
      return False
    ours = context()
    reasons = [f"its {k}" for k in sorted(ours) if hello.get("context", {}).get(k) != ours[k]]
    reasons += differing(env, hello.get("env", {}), hello.get("imported"),
                         hello.get("per_task", ()))
    self.declined = ", ".join(reasons) or None
    if self.declined:
      sock.close()
      return False
    self._env, self._imported = hello["env"], hello["imported"]
    self._per_task = tuple(hello.get("per_task", ()))
    self._socket, self._alive, self.shared = sock, True, True
    threading.Thread(target=self._listen, daemon=True, name="tfdist-preload").start()
    return True

  def _open(self, env: dict[str, str]) -> None:
    from tfdist.machine import children  # Below every room, as this file.
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    self._env = {k: v for k, v in env.items()  # The first task's PYTHONPATH: the server's.
                 if (k not in PER_TASK or k == "PYTHONPATH") and not k.startswith("TFDIST_")}
    self._server = subprocess.Popen(
        [self._python, os.path.abspath(__file__), str(theirs.fileno())], env=self._env,
        pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=children.start_as_child)
    theirs.close()
    self._socket, self._alive = ours, True
    threading.Thread(target=self._listen, daemon=True, name="tfdist-preload").start()

  def _listen(self) -> None:
    """Replies to `start`, and each task's end (its exit code as Popen's `returncode`)."""
    while True:
      try:
        message = self._socket.recv(_MESSAGE)
      except OSError:
        message = b""
      with self._ended:
        if not message:
          for task in self._tasks.values():  # The server died: so did its tasks.
            if task.returncode is None:
              task.returncode = -signal.SIGKILL
          self._alive = False
          self._ended.notify_all()
          return
        reply = json.loads(message)
        if "ended" in reply:
          self._ended.wait_for(lambda: reply["ended"] in self._tasks, timeout=5)
          if reply["ended"] in self._tasks:
            self._tasks[reply["ended"]].returncode = reply["code"]
        else:
          self._replies.append(reply)
        self._ended.notify_all()

  def _gone(self, why: str) -> None:
    self.failed = True
    print(f"tfdist: the preloaded TensorFlow server failed ({why}); tasks start as their own "
          "processes", file=sys.stderr, flush=True)
    return None


class Shared:
  """A preloaded server that many launches share: started now, listening at `path`, used by
  each launch whose tasks' environment has `SHARED_ENV` = `path` and may be forked there (see
  the module's text); ended by `close` or with this process. For a test suite that launches
  many times (tfdist's own: one per test process): each launch skips its own server's import
  of TensorFlow (4-5 CPU-s) and its teardown.

  Args:
    path: the socket's path, a file this creates (Unix sockets take about 100 characters).
    env: its environment, the one the launches' tasks have but for the per-task variables;
      None: this process's (less `UNREAD`).
    python: the interpreter the launches' tasks name.
    per_task: more variables the launches' tasks may have of their own: ones their programs
      read after importing TensorFlow (a test's switches), never one an import reads.

  Example:

  ```python
  server = preload.Shared("/tmp/preload.sock")
  os.environ[preload.SHARED_ENV] = server.path   # each `tfdist launch` started from here
  ...
  server.close()
  ```
  """

  def __init__(self, path: str, env: Mapping[str, str] | None = None,
               python: str = sys.executable, per_task: Sequence[str] = ()):
    from tfdist.machine import children
    self.path = path
    env = {k: v for k, v in (os.environ if env is None else env).items() if k not in UNREAD}
    self._process = subprocess.Popen(
        [python, os.path.abspath(__file__), "--at", path, *per_task], env=env,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, preexec_fn=children.start_as_child)
    while not os.path.exists(path):  # Bound before its import: a launch may connect at once.
      if self._process.poll() is not None:
        raise RuntimeError(f"the shared preloaded server ended with {self._process.returncode} "
                           f"before listening at {path}")
      time.sleep(0.01)

  @property
  def pid(self) -> int:
    return self._process.pid

  def close(self) -> None:
    """Ends it; the tasks it forked die with it."""
    self._process.terminate()
    try:
      self._process.wait(timeout=10)
    except subprocess.TimeoutExpired:
      self._process.kill()
      self._process.wait()
    with contextlib.suppress(OSError):
      os.unlink(self.path)


# The server's side: this file run as a script by `Preloaded`. Standard library only, until it
# imports TensorFlow and Keras.


def listening_at(path: str) -> socket.socket:
  """A Unix socket listening at `path`, which appears only once it listens: bound at a
  temporary name beside it and renamed. Bound at `path` itself, a launch that saw the file
  between the bind and the listen was refused, and started a server of its own (a shared
  server's test, once in a suite on 2 busy cores, 2026-11-29)."""
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  bound = os.path.join(os.path.dirname(path), f".{os.getpid()}.binding")
  listener.bind(bound)
  listener.listen(64)
  os.rename(bound, path)
  return listener


def serve(fd: int | None = None, at: str | None = None, per_task: Sequence[str] = ()) -> None:
  """Imports TensorFlow and Keras, then forks a task for each request and says to its asker
  each one's pid and, once reaped, its exit code. `fd`: one launch's socket (ends when it
  closes); `at`: a path where launches connect (each told this server's environment and
  `context` and its `per_task` names first; a closed connection's live tasks are SIGKILLed;
  ends by a signal)."""
  import selectors
  selector = selectors.DefaultSelector()
  if at is not None:  # Before the import: a launch may connect now and wait for its hello.
    selector.register(listening_at(at), selectors.EVENT_READ, "listener")
  else:
    selector.register(socket.socket(fileno=fd), selectors.EVENT_READ)
  path = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
  base = [p for p in sys.path if os.path.abspath(p) not in path]
  env = dict(os.environ)
  import tensorflow  # noqa: F401  What every task would import.
  import keras  # noqa: F401
  imported = {k: v for k, v in os.environ.items() if env.get(k) != v}  # TF2_BEHAVIOR, ...
  hello = {"env": env, "imported": imported, "context": context(), "per_task": list(per_task)}
  children = _sibling("children")  # Once here; each forked task calls it.
  askers: dict[int, socket.socket | None] = {}  # A task's pid: the connection that asked.
  while True:
    for key, _ in selector.select(timeout=0.05):
      if key.data == "listener":
        connection, _ = key.fileobj.accept()
        _send(connection, hello)
        selector.register(connection, selectors.EVENT_READ)
        continue
      connection = key.fileobj
      try:
        request, fds, _, _ = socket.recv_fds(connection, _MESSAGE, 2)
      except OSError:
        request, fds = b"", []
      if not request:
        if at is None:
          return  # Its tasks die with this server.
        selector.unregister(connection)
        connection.close()
        for pid in [p for p, asker in askers.items() if asker is connection]:
          askers[pid] = None
          with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # As a launch's own server's tasks die with it.
        continue
      try:
        sockets = [k.fileobj for k in selector.get_map().values()]
        pid = _fork(json.loads(request), fds, base, imported, sockets, children)
        askers[pid] = connection
        _send(connection, {"pid": pid})
      except Exception as e:  # noqa: BLE001  Said to the launcher, which starts it itself.
        _send(connection, {"error": f"{type(e).__name__}: {e}"})
      finally:
        for fd_ in fds:
          os.close(fd_)
    with contextlib.suppress(ChildProcessError):
      while (ended := os.waitpid(-1, os.WNOHANG))[0]:
        asker = askers.pop(ended[0], None)
        if asker is not None:
          _send(asker, {"ended": ended[0], "code": os.waitstatus_to_exitcode(ended[1])})


def _send(sock: socket.socket, message: dict) -> None:
  with contextlib.suppress(OSError):
    sock.send(json.dumps(message).encode())


def _sibling(name: str):
  """This folder's module `name`, loaded by path: the server never imports tfdist."""
  import importlib.util
  spec = importlib.util.spec_from_file_location(
      f"_tfdist_{name}", os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _fork(request: dict, out: list[int], base: list[str], imported: dict[str, str],
          sockets: list[socket.socket], children) -> int:
  pid = os.fork()
  if pid:
    return pid
  code = 1
  try:
    for sock in sockets:
      sock.close()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # A shared server's handler is not theirs.
    os.setsid()
    children.start_as_child()  # Dies with the server, which dies with its launcher.
    code = _run(request, out, base, imported)
  except BaseException:  # noqa: BLE001  Before the program ran: said on its output.
    import traceback
    traceback.print_exc()
  finally:
    if code < 0:  # Ended by an uncaught KeyboardInterrupt: by SIGINT, as the interpreter.
      signal.signal(-code, signal.SIG_DFL)
      os.kill(os.getpid(), -code)
    os._exit(code)  # noqa: SLF001  Never back into the server's loop.


def _run(request: dict, out: list[int], base: list[str], imported: dict[str, str]) -> int:
  """The forked task, made as a fresh interpreter would be, then its program run; its exit
  code. `out`: its output's file descriptor, and its errors' if not the same. `imported`: the
  variables TensorFlow's import set in the server, which the task's own import would have set."""
  import atexit
  import builtins
  import io
  import runpy
  import types
  null = os.open(os.devnull, os.O_RDONLY)
  for fd, to in ((null, 0), (out[0], 1), (out[-1], 2)):
    os.dup2(fd, to)
  for fd in {null, *out}:
    os.close(fd)
  env, argv = request["env"], list(request["argv"][1:])
  os.chdir(request["cwd"])
  os.environ.clear()
  os.environ.update({**imported, **env})
  import tempfile
  tempfile.tempdir = None  # The import cached the server's TMPDIR: the task's is read again.
  unbuffered = argv[0] == "-u" or bool(env.get("PYTHONUNBUFFERED"))
  argv = argv[1:] if argv[0] == "-u" else argv
  server_streams = {id(sys.stdout): 1, id(sys.stderr): 2}
  sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.open(0, "rb", closefd=False))
  sys.stdout = sys.__stdout__ = _stream(1, unbuffered, "strict", line=False)
  sys.stderr = sys.__stderr__ = _stream(2, unbuffered, "backslashreplace", line=True)
  _log_handlers_to(server_streams)
  numpy = sys.modules.get("numpy")
  if numpy is not None:
    numpy.random.seed()  # Python's `random` reseeds itself in a fork; NumPy's does not.
  path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
  module = argv[1] if argv[0] == "-m" else None
  first = os.getcwd() if module else os.path.dirname(os.path.realpath(argv[0]))
  sys.path[:] = [first, *path, *base]
  if env.get(_PREPARE_ENV) == "1":
    faulthandler.enable(all_threads=True)  # A task dying of a signal leaves its stack.
    _import_tfdist_after(builtins)
  sys.argv = ["-m", *argv[2:]] if module else argv
  sys.modules["__main__"] = main = types.ModuleType("__main__")  # Not the server's.
  main.__builtins__ = builtins
  code = 0
  try:
    if module:
      runpy._run_module_as_main(module, alter_argv=True)  # noqa: SLF001  As `-m` does.
    elif os.path.isdir(argv[0]) or not argv[0].endswith(".py") and _is_zip(argv[0]):
      runpy.run_path(argv[0], run_name="__main__")
    else:
      _run_file(argv[0], main)
  except SystemExit as e:
    code = _exit_code(e.code)
  except BaseException as e:  # noqa: BLE001  As the interpreter: its hook prints it, exit 1.
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
      tb = tb.tb_next  # The program's frames, not this file's.
    sys.excepthook(type(e), e, tb)
    code = -signal.SIGINT if isinstance(e, KeyboardInterrupt) else 1
  import threading as threads
  threads._shutdown()  # noqa: SLF001  The script's threads, joined as at a normal exit.
  atexit._run_exitfuncs()  # noqa: SLF001
  for name in [n for n in main.__dict__ if n != "__builtins__"]:
    main.__dict__[name] = None  # As the interpreter's teardown: a file left open is flushed.
  import gc
  gc.collect()
  for stream in (sys.stdout, sys.stderr):
    with contextlib.suppress(Exception):
      stream.flush()
  return code


def _log_handlers_to(server_streams: dict[int, int]) -> None:
  """The logging handlers the server's imports made (TensorFlow's, absl's) write to the task's
  `sys.stdout`/`sys.stderr`, as a fresh interpreter's would: left on the server's stream
  objects, absl's handler took them for files of its own and closed them at exit, and each
  warning of the task's teardown (an unrestored `tf.train.Checkpoint`'s) printed a "Logging
  error" traceback."""
  logging = sys.modules.get("logging")
  if logging is None:
    return
  loggers = [logging.root, *logging.Logger.manager.loggerDict.values()]
  for handler in [h for logger in loggers for h in getattr(logger, "handlers", [])]:
    fd = server_streams.get(id(getattr(handler, "stream", None)))
    if fd is not None:
      handler.setStream(sys.stdout if fd == 1 else sys.stderr)


def _run_file(path: str, main) -> None:
  """`python PATH`: the file's code run in the `__main__` module, as the interpreter runs it."""
  from importlib.machinery import SourceFileLoader
  with open(path, "rb") as f:
    source = f.read()
  main.__dict__.update(__file__=path, __cached__=None, __loader__=SourceFileLoader(
      "__main__", path), __spec__=None, __package__=None)
  exec(compile(source, path, "exec", dont_inherit=True), main.__dict__)  # noqa: S102


def _is_zip(path: str) -> bool:
  import zipfile
  return zipfile.is_zipfile(path)


def _stream(fd: int, unbuffered: bool, errors: str, line: bool):
  import io
  raw = io.open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)
  return io.TextIOWrapper(raw, encoding=sys.stdout.encoding, errors=errors,
                          line_buffering=line and not unbuffered, write_through=unbuffered)


def _exit_code(code) -> int:
  """A `SystemExit`'s code as the interpreter makes it an exit status."""
  if code is None:
    return 0
  if isinstance(code, int):
    return code & 0xFF
  print(code, file=sys.stderr)
  return 1


def _import_tfdist_after(builtins) -> None:
  """tfdist imported just after the script's first import of TensorFlow or Keras (or tfdist,
  which imports itself), as `tfdist/script_hook`'s `sitecustomize` does in a fresh interpreter:
  here both are imported already, so their first `import` statement is the moment."""
  original = builtins.__import__

  def hooked(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002
    module = original(name, globals, locals, fromlist, level)
    if level == 0 and name.split(".")[0] in (*_HOOKED, "tfdist"):
      builtins.__import__ = original
      original("tfdist")
    return module
  builtins.__import__ = hooked


if __name__ == "__main__":
  del sys.path[0]  # This folder: its modules are not the task's.
  if sys.argv[1] == "--at":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # Its socket's file removed.
    try:
      serve(at=sys.argv[2], per_task=sys.argv[3:])
    finally:
      with contextlib.suppress(OSError):
        os.unlink(sys.argv[2])
  else:
    serve(int(sys.argv[1]))
