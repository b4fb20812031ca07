"""HTTP to other processes, memory between nodes of one process (`runtime.transport = "colocated"`).

A worker of placement "shared" hosts hundreds of nodes on one event loop; over "http" a read
between two of them still goes through a socket pair, aiohttp's client and server and the
event loop's I/O, which was about half of a 1000-node worker's time. A `ColocatedEndpoint` is
an HTTP `Endpoint` (it serves and reaches other processes, the coordinator and other machines
as before) that reaches a peer started in its own process and event loop in memory, with the
same sealed, signed and verified frames, counted at their frame sizes (`InMemory`). Results,
bytes and rejections are those of a run over "http"; only where each frame travels differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from p2pfl.runtime.transport.http import Endpoint
from p2pfl.runtime.transport.loopback import InMemory
from p2pfl.wire import Message


class ColocatedEndpoint(InMemory, Endpoint):
    async def start(self, host: str, port: int) -> None:
        await Endpoint.start(self, host, port)
        self._register(host, port)

    async def listen(self) -> None:
        await Endpoint.listen(self)
        self._register(*self._listen_at)

    async def stop_listening(self) -> None:
        self._unregister()
        await Endpoint.stop_listening(self)

    async def close(self) -> None:
        self._unregister()
        await Endpoint.close(self)

    async def _fetch(self, peer: str, part: str, min_version: int, timeout: float) -> Message | None:
        if self._in_memory(peer) is not None:
            return await self._fetch_in_memory(peer, part, min_version, timeout)
        return await Endpoint._fetch(self, peer, part, min_version, timeout)

    async def push(self, target: str, *, kind: str, part: str, round_: int, version: int,
                   tensors: Mapping[str, Any], meta: Mapping[str, Any], timeout: float) -> bool:
        message = dict(kind=kind, part=part, round_=round_, version=version, tensors=tensors, meta=meta, timeout=timeout)
        if self._in_memory(target) is not None:
            return await self._push_in_memory(target, **message)  # type: ignore[arg-type]
        return await Endpoint.push(self, target, **message)  # type: ignore[arg-type]

    def answers_locally(self, peer: str) -> bool:
        return self._in_memory(peer) is not None

    async def status_of(self, peer: str, timeout: float = 2.0) -> dict[str, Any] | None:
        if self._in_memory(peer) is not None:
            return self._status_in_memory(peer)
        return await Endpoint.status_of(self, peer, timeout)

    async def is_up(self, peer: str, timeout: float) -> bool:
        if self.answers_locally(peer):
            return self._status_in_memory(peer) is not None
        return await Endpoint.is_up(self, peer, timeout)
