"""The connection guard in front of aiohttp: a cap on open connections (counted before a TLS
handshake), and a deadline for request headers, which aiohttp itself would wait for forever.

Every counted connection is released by an event, never by the garbage collector: a plain one
when it is lost; one still shaking hands when its handshake fails, times out or its socket
closes (`TlsHandshake` runs the handshake itself, `loop.start_tls`, so that it sees each end).
Before, handshaking connections sat in a weak set that only a full collection emptied: 520
silent TLS connections from an outsider locked a node out for minutes.

The cap is shared fairly among members: a connection belongs to the member whose signed request
it carried last, and while the cap is full a newcomer takes the place of the oldest connection of
a member holding more than its share (the cap over the roster's members, at least one). Before,
one member that kept its connections open had every other member's new connections refused."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
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
        self.member: str | None = None  # whose signed request it carried last
        self.opened = 0.0
        self.admitted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        ep = self.endpoint
        if ep.closing:  # accepted as the server closed: nobody would answer it
            transport.close()
            return
        if len(ep.connections) >= ep.server_limits.max_connections and not make_room(ep):
            ep.rejections.add(UNVERIFIED, 503, "too_many_connections",
                              f"connection refused: {len(ep.connections)} open, limit {ep.server_limits.max_connections}")
            transport.close()
            return
        ep.connections[transport] = self
        self.admitted, self.opened = True, asyncio.get_running_loop().time()
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
        if self.transport is not None and self.endpoint.connections.get(self.transport) is self:
            del self.endpoint.connections[self.transport]
        if self.admitted:
            self.admitted = False
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class TlsHandshake(asyncio.Protocol):
    """A TLS connection from accept to the end of its handshake: counted against the cap from
    the start, and released when the handshake ends however it ends; a finished handshake hands
    the connection to a `GuardedProtocol`."""

    def __init__(self, endpoint: Endpoint, app: Callable[[], GuardedProtocol]) -> None:
        self.endpoint, self.app = endpoint, app
        self.task: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        ep = self.endpoint
        held = len(ep.connections) + len(ep.handshaking)
        if held >= ep.server_limits.max_connections and not make_room(ep):
            ep.rejections.add(UNVERIFIED, 503, "too_many_connections",
                              f"connection refused before its TLS handshake: {held} open or shaking hands, "
                              f"limit {ep.server_limits.max_connections}")
            transport.abort()
            return
        ep.handshaking.add(self)
        transport.pause_reading()  # the ClientHello waits for start_tls, which resumes reading
        self.task = asyncio.ensure_future(self._handshake(transport))  # type: ignore[arg-type]

    async def _handshake(self, raw: asyncio.Transport) -> None:
        ep = self.endpoint
        app = self.app()
        try:
            secured = await asyncio.get_running_loop().start_tls(
                raw, app, ep.tls, server_side=True, ssl_handshake_timeout=ep.server_limits.handshake_timeout_s)
        except (Exception, asyncio.CancelledError):  # failed, timed out, or the peer went: start_tls closed it
            raw.abort()
            return
        finally:
            ep.handshaking.discard(self)
        if secured is None:  # the socket closed as the handshake ended
            return
        app.connection_made(secured)

    def connection_lost(self, exc: Exception | None) -> None:  # before start_tls took the socket over
        self.endpoint.handshaking.discard(self)
        if self.task is not None:
            self.task.cancel()


def connection_signed_by(endpoint: Endpoint, transport: asyncio.BaseTransport | None, member: str) -> None:
    """The connection `transport` carried a request `member` signed: it counts as theirs."""
    guard = endpoint.connections.get(transport) if transport is not None else None
    if guard is not None:
        guard.member = member


def make_room(endpoint: Endpoint) -> bool:
    """The cap is full: the member holding the most connections gives up its oldest, if it holds
    more than its share. False where no member does (the newcomer is refused, as before)."""
    guards = [g for g in endpoint.connections.values() if g.member is not None]
    if not guards:
        return False
    member, count = Counter(g.member for g in guards).most_common(1)[0]
    cap = endpoint.server_limits.max_connections
    share = max(1, cap // max(1, len(endpoint.roster)))
    if count <= share:
        return False
    oldest = min((g for g in guards if g.member == member), key=lambda g: g.opened)
    endpoint.rejections.add(member, 503, "over_connection_share",
                            f"{member} held {count} connections (its share {share}) while the cap of {cap} was "
                            f"full: its oldest was aborted to let a newcomer in")
    if oldest.transport is not None:
        del endpoint.connections[oldest.transport]  # its place is the newcomer's now, not when the loss is seen
        oldest.transport.abort()
    return True
