"""Free ports for a cluster on this machine."""

from __future__ import annotations

import portpicker


def free_ports(count: int) -> list[int]:
  """`count` distinct free TCP ports from portpicker (the picker TensorFlow's own multi-process
  tests use; it also asks a portserver, when one runs, which hands each port out once)."""
  ports: list[int] = []
  while len(ports) < count:
    port = portpicker.pick_unused_port()
    if port not in ports:
      ports.append(port)
  return ports
