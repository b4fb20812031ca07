"""Free TCP ports for a run's nodes on this machine (plain sockets: picking ports loads no carrier).

A port is picked at launch and listened on only once its node has started, seconds or minutes
later. Picked from the kernel's ephemeral range (what `bind(port 0)` hands out), it can be taken
in between as the local end of an outgoing connection: with several runs on one machine their
HTTP clients open thousands, and a node then failed with "address already in use" (seen with ten
runs at once on a 16-core machine). Ports below that range are never handed to outgoing
connections, so the ports are drawn there, at random, each checked free when drawn.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10_000  # below: the well-known and registered services a machine may run


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """The kernel's range for outgoing connections' local ports; None where it cannot be read."""
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


def free_ports(count: int, host: str, *, ephemeral: tuple[int, int] | None = None,
               rng: random.Random | None = None) -> list[int]:
    """`count` distinct ports on `host` that nobody listens on now: drawn below the ephemeral range
    (`ephemeral` as the kernel reports it unless given) while it has untried ones, then from the kernel."""
    ephemeral = ephemeral if ephemeral is not None else ephemeral_range()
    below = range(LOWEST, ephemeral[0]) if ephemeral is not None else range(0)
    rng = rng or random.SystemRandom()  # two runs started together must not draw the same sequence
    sockets: list[socket.socket] = []
    ports: list[int] = []
    tried: set[int] = set()
    try:
        while len(ports) < count:
            # Every port below the range is tried before the kernel picks one: 10,000 nodes once
            # drew theirs from the kernel (the rule was 4 x room below), and a worker died when
            # its node's port had become another connection's local end meanwhile.
            port = rng.choice(below) if len(tried) < len(below) else 0
            if port and port in tried:
                continue
            tried.add(port)
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the listener will
            try:
                s.bind((host, port))
            except OSError:
                s.close()
                if port == 0:
                    raise
                continue
            if s.getsockname()[1] in ports:  # SO_REUSEADDR lets two unlistened sockets share a port
                s.close()
                continue
            sockets.append(s)  # held until all are drawn, so they are distinct
            ports.append(s.getsockname()[1])
    finally:
        for s in sockets:
            s.close()
    return ports
