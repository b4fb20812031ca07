"""The connection guard in front of aiohttp: a cap on open connections (counted before a TLS
handshake), and a deadline for request headers, which aiohttp itself would wait for forever."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from p2pfl.runtime.rejections import UNVERIFIED

if TYPE_CHECKING:
    from p2pfl.runtime.transport.http import Endpoint


class GuardedProtocol(asyncio.Protocol):
    """Wraps aiohttp's per-connection handler: caps open connections and closes a connection
    whose request headers have not arrived within `read_timeout_s`. (aiohttp itself waits for
    headers forever; a connection that never sends any would hold a file descriptor.)"""

    def __init__(self, inner: asyncio.Protocol, endpoint: Endpoint) -> None:
        self.inner = inner
        self.endpoint = endpoint
        self.transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._tail = b""
        if endpoint.tls is not None:
            # Made at accept, before the TLS handshake (connection_made comes after it): the cap
            # counts connections still shaking hands too. A protocol whose handshake failed is
            # dropped by asyncio, and with it its place in the weak set.
            held = len(endpoint.connections) + len(endpoint.handshaking)
            if held >= endpoint.server_limits.max_connections:
                endpoint.rejections.add(UNVERIFIED, 503, "too_many_connections",
                                        f"connection refused before its TLS handshake: {held} open or shaking "
                                        f"hands, limit {endpoint.server_limits.max_connections}")
                raise ConnectionRefusedError("connection cap reached")  # asyncio closes the socket
            endpoint.handshaking.add(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        ep = self.endpoint
        ep.handshaking.discard(self)
        if len(ep.connections) >= ep.server_limits.max_connections:
            ep.rejections.add(UNVERIFIED, 503, "too_many_connections",
                              f"connection refused: {len(ep.connections)} open, limit {ep.server_limits.max_connections}")
            transport.close()
            return
        ep.connections.add(self)
        self._arm()
        self.inner.connection_made(transport)

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.endpoint.server_limits.read_timeout_s, self._headers_timed_out)

    def _headers_timed_out(self) -> None:
        self.endpoint.rejections.add(UNVERIFIED, 408, "header_timeout",
                                     f"no complete request headers within {self.endpoint.server_limits.read_timeout_s:g} s")
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._timer is not None:
            # Headers end at the first blank line; after that the handler's own timeouts apply.
            seen = self._tail + data
            if b"\r\n\r\n" in seen:
                self._timer.cancel()
                self._timer = None
            self._tail = seen[-3:]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self in self.endpoint.connections:
            self.endpoint.connections.discard(self)
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()
