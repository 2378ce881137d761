"""Free ports for a cluster on this machine, held until the launch ends.

A port is held by a socket bound to it with SO_REUSEADDR and never listening: other programs
cannot bind it, the kernel does not hand it out as an ephemeral port (a peer's outgoing
connection could otherwise take a port before its task binds it), and TensorFlow's gRPC server,
which binds with SO_REUSEADDR, still can. (SO_REUSEPORT would not do: TensorFlow's server
refuses to share a port that way; measured with TensorFlow 2.21.)
"""

from __future__ import annotations

import socket

import portpicker


class HeldPorts:
  """`count` distinct free TCP ports from portpicker (the picker TensorFlow's own multi-process
  tests use; it also asks a portserver, when one runs), each held until `close()`."""

  def __init__(self, count: int):
    self._sockets: list[socket.socket] = []
    self.ports: list[int] = []
    while len(self.ports) < count:
      port = portpicker.pick_unused_port()
      held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      try:
        held.bind(("", port))
      except OSError:  # Taken since portpicker looked: pick another.
        held.close()
        continue
      if port in self.ports:
        held.close()
        continue
      self._sockets.append(held)
      self.ports.append(port)

  def close(self) -> None:
    for held in self._sockets:
      held.close()
    self._sockets.clear()

  def __enter__(self) -> "HeldPorts":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def free_ports(count: int) -> list[int]:
  """`count` distinct free ports, not held (for tests and benchmarks that bind them at once)."""
  with HeldPorts(count) as held:
    return held.ports


def accepts(address: str, timeout: float = 0.2) -> bool:
  """True when a TCP connection to `host:port` (`[v6]:port`; checked by the config) succeeds:
  the task's server is up."""
  host, _, port = address.rpartition(":")
  try:
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
      return True
  except OSError:
    return False
