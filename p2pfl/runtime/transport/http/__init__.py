"""Signed frames over HTTP(S): the carrier between processes and machines (`runtime.transport = "http"`).

An `Endpoint` serves its recent published versions of each part by long-poll GET (a read for
version R gets the earliest held version >= R), accepts signed pushes on its inbox, and
fetches from and pushes to others. Every message that crosses it is a sealed wire frame; every
byte is counted. It knows nothing about models or algorithms: callers give it tensors and a
function that says which tensors to expect.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web
import asyncio

from p2pfl.runtime.tls import pin
from p2pfl.runtime.transport.base import Carrier
from p2pfl.runtime.transport.http.client import HttpClient
from p2pfl.runtime.transport.http.guard import GuardedProtocol, TlsHandshake
from p2pfl.runtime.transport.limits import ServerLimits
from p2pfl.runtime.transport.rate import MemberRates
from p2pfl.runtime.transport.http.server import HttpServer

if TYPE_CHECKING:
    from p2pfl.runtime.transport import TransportSettings


class Endpoint(HttpServer, HttpClient, Carrier):
    def __init__(self, settings: TransportSettings) -> None:
        super().__init__(settings)
        self.tls = settings.tls
        # peer -> SHA-256 of its certificate: checked during the handshake, before a request byte is sent.
        self._pins = {peer: pin(fp) for peer, fp in settings.pins.items()}
        self._runner: web.AppRunner | None = None
        self._server: asyncio.AbstractServer | None = None
        self.closing = False  # the server is closing: a connection accepted now is closed at once
        self._session: aiohttp.ClientSession | None = None
        self.connections: dict[asyncio.BaseTransport, GuardedProtocol] = {}  # counted under the cap, by transport
        self.handshaking: set[TlsHandshake] = set()  # TLS connections counted before their handshake ends
        self.buffered_body_bytes = 0  # of pushes being read now (ServerLimits.max_buffered_body_bytes)
        self.buffered_by_sender: dict[str, int] = {}  # the same, per member: each has its share
        self.reading_seqs: set[tuple[str, int]] = set()  # (sender, seq) of heads whose bodies are being read
        self._rates: tuple[ServerLimits, MemberRates] | None = None

    def pin_peer(self, peer: str, fingerprint: str) -> None:
        """Pin `peer`'s TLS certificate from now on (a member admitted while the node runs)."""
        self._pins[peer] = pin(fingerprint)

    @property
    def member_rates(self) -> MemberRates:
        """Each member's token bucket, made anew when `server_limits` is replaced."""
        if self._rates is None or self._rates[0] is not self.server_limits:
            limits = self.server_limits
            self._rates = (limits, MemberRates(limits.requests_per_s_per_peer, limits.request_burst_per_peer))
        return self._rates[1]

    async def start(self, host: str, port: int) -> None:
        self._listen_at = (host, port)
        await self._start_server(host, port)
        self._session = aiohttp.ClientSession()

    async def listen(self) -> None:
        await self._start_server(*self._listen_at)

    async def stop_listening(self) -> None:
        await self.withdraw()  # what it served is gone, as with a process that died; waiting reads end now
        await self._close_server()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        await self._close_server()

