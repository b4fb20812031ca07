"""Free TCP ports for a run's nodes on this machine (plain sockets: picking ports loads no carrier)."""

from __future__ import annotations

import socket


def free_ports(count: int, host: str) -> list[int]:
    """`count` ports on `host` that nobody listens on now (bound together, so all distinct)."""
    sockets, ports = [], []
    for _ in range(count):
        s = socket.socket()
        s.bind((host, 0))
        sockets.append(s)
        ports.append(s.getsockname()[1])
    for s in sockets:
        s.close()
    return ports
