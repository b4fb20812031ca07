"""HTTP transport shared by nodes and the coordinator.

An `Endpoint` serves its recent published versions of each part by long-poll GET (a read
for version R gets the earliest held version >= R), accepts signed pushes on its inbox, and
fetches/pushes to others. Every message that crosses it is a sealed wire frame; every byte is
counted. It knows nothing about models or algorithms: callers give it encoded bodies and a
function that says which tensors to expect.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import math
import json
import logging
import socket
import ssl
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from p2pfl.runtime.accounting import CONTROL, ByteCounter
from p2pfl.runtime.metadata import GOODBYE_META, Schema, check_meta
from p2pfl.runtime.rejections import UNVERIFIED, RejectionLog, sender_label
from p2pfl.runtime.tls import pin
from p2pfl.runtime.transport_api import SETUP_PREFIX
from p2pfl.wire import (
    PREFIX_BYTES,
    EncodedBody,
    Frame,
    Message,
    NodeKey,
    ReplayGuard,
    Roster,
    WireError,
    WireLimits,
    authenticate_head,
    encode_body,
    head_length,
    open_message,
    seal,
    seal_frame,
)
from p2pfl.wire.errors import quote
from p2pfl.wire.request import AUTH_HEADER, request_for, verify_request

CONTENT_TYPE = "application/x-p2pfl"
STATUS_POLLS_AT_ONCE = 8  # per node, while waiting for peers to come up
STATUS_POLL_TIMEOUT_S = 5.0
REJECTED = "rejected"  # bytes of messages that failed validation still crossed the wire
GOODBYE = "goodbye"  # kind of the signed message a failing node sends so that nobody waits for it
ExpectedSpec = Mapping[str, tuple[tuple[int, ...], str]]
MAX_WAIT_S = 600.0
MAX_VERSION = 2**62


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


@dataclass(frozen=True)
class ServerLimits:
    """What one node's HTTP server grants to anybody, verified or not."""

    read_timeout_s: float = 30.0       # to send the request's headers, and then its body
    max_connections: int = 512         # open connections in total; more are closed at once
    max_requests_per_peer: int = 16    # concurrent reads per verified requester (long-polls included)
    handshake_timeout_s: float = 5.0   # TLS: to finish the handshake (asyncio's default is 60 s)
    write_timeout_s: float = 60.0      # to write one answer; a reader that reads slower is cut off
    # Bodies of pushes being read at once, in bytes, whoever sent them; beyond it a push is
    # answered 429 before its body is read. A few of the largest messages fit (4 x 64 MiB).
    max_buffered_body_bytes: int = 256 * 2**20


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


@dataclass(frozen=True)
class Published:
    version: int
    round: int
    bodies: Mapping[str, EncodedBody]
    meta: Mapping[str, Any]
    # part -> reader -> body: a reply meant for one node, served to that node only.
    addressed: Mapping[str, Mapping[str, EncodedBody]] = field(default_factory=dict)


# A node keeps serving the round versions it published while their bodies fit in this many
# bytes (`runtime.held_mb`), the latest always. A read for round R gets the earliest held
# version >= R, so a peer that ran ahead still serves the round a slower node asks for, and
# which version a node aggregates does not depend on timing: the same seed, the same run. Under
# a Dirichlet split the nodes with little data run ten rounds ahead of the rest; the 10-node
# scenarios' 20 to 30 versions of a 0.4 MiB model fit many times over.
DEFAULT_HELD_BYTES = 32 * 2**20


def published_bytes(published: Published) -> int:
    """The encoded bytes one published version holds: every part and every addressed reply."""
    return (sum(b.nbytes for b in published.bodies.values())
            + sum(b.nbytes for per_reader in published.addressed.values() for b in per_reader.values()))


class PartStore:
    """The published versions that fit in `held_bytes` (the latest always): a GET gets the
    earliest held version at or after the one it asks for, and one asking for a newer version
    waits on the condition."""

    def __init__(self, held_bytes: float = DEFAULT_HELD_BYTES) -> None:
        self.latest: Published | None = None
        self.held_bytes = held_bytes
        self.recent: collections.deque[Published] = collections.deque()
        self._recent_bytes = 0
        # Rounds up to here this node sits out (partial participation): nobody waits for them.
        self.sitting_out_through = 0
        # A failed node serves nothing more: reads waiting on it end now, not at their timeout
        # (which also held the node's shutdown for as long).
        self.withdrawn = False
        self._changed = asyncio.Condition()

    async def sit_out(self, round_: int) -> None:
        async with self._changed:
            self.sitting_out_through = max(self.sitting_out_through, round_)
            self._changed.notify_all()

    async def publish(self, published: Published) -> None:
        async with self._changed:
            self.latest, self.withdrawn = published, False
            self.recent.append(published)
            self._recent_bytes += published_bytes(published)
            while len(self.recent) > 1 and self._recent_bytes > self.held_bytes:
                self._recent_bytes -= published_bytes(self.recent.popleft())
            self._changed.notify_all()

    async def withdraw(self) -> None:
        async with self._changed:
            self.latest, self.withdrawn = None, True
            self.recent.clear()
            self._recent_bytes = 0
            self._changed.notify_all()

    def held(self, min_version: int) -> Published | None:
        """The earliest held version >= `min_version`, else the latest (older: a stale answer)."""
        return next((p for p in self.recent if p.version >= min_version), self.latest)

    async def wait_for(self, min_version: int, timeout: float) -> Published | None:
        def ready() -> bool:
            if self.withdrawn or self.sitting_out_through >= min_version:
                return True
            return self.latest is not None and self.latest.version >= min_version

        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(ready), timeout=max(timeout, 0.0))
            except asyncio.TimeoutError:
                pass
            return self.held(min_version)


class SetupStore(PartStore):
    """Every setup step a node published, kept (no byte limit): a read of step s gets the
    earliest step >= s that holds the part, so a peer that is ahead never hides the step a
    slower one still needs."""

    def __init__(self) -> None:
        super().__init__(held_bytes=math.inf)

    def earliest(self, min_version: int, part: str) -> Published | None:
        for published in self.recent:
            if published.version >= min_version and (part in published.bodies or part in published.addressed):
                return published
        return None

    async def wait_for_part(self, min_version: int, timeout: float, part: str) -> Published | None:
        async with self._changed:
            try:
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self.withdrawn or self.earliest(min_version, part) is not None),
                    timeout=max(timeout, 0.0))
            except asyncio.TimeoutError:
                pass
            return self.earliest(min_version, part)


class Endpoint:
    def __init__(
        self,
        *,
        node_id: str,
        key: NodeKey,
        roster: Roster,
        urls: Mapping[str, str],
        counter: ByteCounter,
        limits: WireLimits,
        expected_for: Callable[[str, str], ExpectedSpec | None] = lambda kind, part: None,
        on_message: Callable[[Message], None] = lambda message: None,
        status: Callable[[], dict[str, Any]] = dict,
        meta_schema_for: Callable[[str, str], Schema | None] = lambda kind, part: None,
        on_departed: Callable[[str, str], None] | None = None,
        max_skew_s: float = 300.0,
        retry_s: float = 0.25,
        server_limits: ServerLimits = ServerLimits(),
        tls: ssl.SSLContext | None = None,
        pins: Mapping[str, str] | None = None,
        log: logging.Logger | None = None,
        held_bytes: float = DEFAULT_HELD_BYTES,
    ) -> None:
        self.node_id = node_id
        self.key = key
        self.roster = roster
        self.urls = dict(urls)
        self.counter = counter
        self.limits = limits
        self.expected_for = expected_for
        self.meta_schema_for = meta_schema_for
        self.on_message = on_message
        self.status = status
        self.on_departed = on_departed
        # Peers that said goodbye: fetches from them end at once, now and in later rounds.
        self.departed: dict[str, str] = {}
        self._inflight: dict[str, set[asyncio.Future[Message | None]]] = {}
        self.replay = ReplayGuard(max_skew_s=max_skew_s)
        self.retry_s = retry_s
        self.log = log or logging.getLogger(f"p2pfl.{node_id}")
        self.store = PartStore(held_bytes)
        # Parts named "setup.*" (the exchange before round 1) have their own versions, so setup
        # steps never shadow a round's parts.
        self.setup_store = SetupStore()
        # Sequence numbers from the clock (microseconds): a restarted node goes on above every
        # number its peers saw from it before, so they never take its new messages for replays.
        self._seq = itertools.count(time.time_ns() // 1000)
        self._runner: web.AppRunner | None = None
        self._server: asyncio.AbstractServer | None = None
        self._session: aiohttp.ClientSession | None = None
        self.server_limits = server_limits
        self.tls = tls
        # peer -> SHA-256 of its certificate: checked during the handshake, before a request byte is sent.
        self._pins = {peer: pin(fp) for peer, fp in (pins or {}).items()}
        self.connections: set[GuardedProtocol] = set()
        self.handshaking: weakref.WeakSet[GuardedProtocol] = weakref.WeakSet()
        self.buffered_body_bytes = 0  # of pushes being read now (ServerLimits.max_buffered_body_bytes)
        self._reads_by_peer: dict[str, int] = {}
        self.rejections = RejectionLog(self.log)

    # ---- server -----------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.limits.max_message_bytes, middlewares=[self._no_server_errors])
        app.router.add_get("/v1/parts/{part}", self._serve_part)
        app.router.add_post("/v1/inbox", self._inbox)
        app.router.add_get("/v1/status", self._status)
        return app

    async def start(self, host: str, port: int) -> None:
        # auto_decompress=False: a compressed body must be refused, not inflated by the parser first.
        self._runner = web.AppRunner(self.app(), access_log=None, keepalive_timeout=15.0, auto_decompress=False)
        await self._runner.setup()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: GuardedProtocol(server(), self), host, port, reuse_address=True, ssl=self.tls,
            ssl_handshake_timeout=self.server_limits.handshake_timeout_s if self.tls is not None else None)
        self._session = aiohttp.ClientSession()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._server is not None:
            self._server.close()
        if self._runner is not None:
            await self._runner.cleanup()
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()

    def _pin_mismatch(self, peer: str, exc: aiohttp.ServerFingerprintMismatch) -> None:
        """Whoever answered at `peer`'s address is not `peer`: nothing was sent, nothing is retried."""
        self.rejections.add(peer, 495, "tls_pin_mismatch",
                            f"TLS certificate at {self.urls[peer]} has fingerprint {exc.got.hex()}, the roster pins "
                            f"{exc.expected.hex()}")

    def _ssl(self, peer: str) -> aiohttp.Fingerprint | bool:
        """The pin of `peer`'s certificate; without one, a TLS URL needs a CA-verified certificate."""
        return self._pins.get(peer, True)

    def next_seq(self) -> int:
        return next(self._seq)

    async def publish(self, version: int, round_: int, parts: Mapping[str, Mapping[str, Any]], meta: Mapping[str, Any],
                      addressed: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None) -> None:
        """Encode each part once; every GET for this version reuses the body and only re-seals the header.

        `addressed` (part -> node -> tensors) are replies each served to its node only. Parts
        named "setup.*" go to the setup store, whose versions are setup steps, not rounds.
        The encoded body references the tensors' memory: `parts` must be snapshots that
        nobody changes afterwards (`p2pfl.runtime.placement.host_snapshot`)."""
        names = list(parts) + list(addressed or {})
        setup = [n.startswith(SETUP_PREFIX) for n in names]
        if any(setup) and not all(setup):
            raise ValueError(f"setup parts and round parts are published separately, got {names}")

        def encode() -> tuple[dict[str, EncodedBody], dict[str, dict[str, EncodedBody]]]:
            return ({name: encode_body(t) for name, t in parts.items()},
                    {name: {node: encode_body(t) for node, t in per_node.items()} for name, per_node in (addressed or {}).items()})

        bodies, addressed_bodies = await asyncio.to_thread(encode)
        store = self.setup_store if any(setup) else self.store
        await store.publish(Published(version, round_, bodies, dict(meta), addressed_bodies))

    @web.middleware
    async def _no_server_errors(self, request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        """No request path answers 5xx: an exception a handler did not foresee is the request's fault."""
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:  # noqa: BLE001 - turned into a 400 with the reason
            return self._reject(UNVERIFIED, 400, f"unhandled {type(exc).__name__}: {exc}", kind="unhandled")

    async def _serve_part(self, request: web.Request) -> web.StreamResponse:
        part = request.match_info["part"]
        try:
            min_version = int(request.query.get("min_version", "0"))
            wait = float(request.query.get("wait", "0"))
        except ValueError:
            return self._reject(UNVERIFIED, 400, "min_version must be an integer and wait a number", kind="bad_query")
        if not 0 <= min_version <= MAX_VERSION:
            return self._reject(UNVERIFIED, 400, f"min_version must be in [0, 2**62], got {min_version}", kind="bad_query")
        if not (math.isfinite(wait) and 0 <= wait <= MAX_WAIT_S):
            return self._reject(UNVERIFIED, 400, f"wait must be a number of seconds in [0, {MAX_WAIT_S:g}], got {wait}",
                                kind="bad_query")
        try:
            signed = verify_request(request.headers.get(AUTH_HEADER), roster=self.roster, target=self.node_id,
                                    part=part, min_version=min_version, replay=self.replay)
        except WireError as exc:
            return self._reject(UNVERIFIED, exc.status, f"read of {quote(part, 20)}: {exc}", kind=exc.reason)
        requester = signed.requester
        if self._reads_by_peer.get(requester, 0) >= self.server_limits.max_requests_per_peer:
            return self._reject(requester, 429, f"{self._reads_by_peer[requester]} reads from {requester} already waiting",
                                kind="too_many_requests")
        # A read holds its place under the cap until its answer is written, not only while it
        # waits: a reader that never reads cannot hold more than max_requests_per_peer answers.
        self._reads_by_peer[requester] = self._reads_by_peer.get(requester, 0) + 1
        try:
            return await self._answer_read(request, part, min_version, wait, requester)
        finally:
            self._reads_by_peer[requester] -= 1

    async def _answer_read(self, request: web.Request, part: str, min_version: int, wait: float,
                           requester: str) -> web.StreamResponse:
        store: PartStore = self.setup_store if part.startswith(SETUP_PREFIX) else self.store
        if part.startswith(SETUP_PREFIX):
            published = await self.setup_store.wait_for_part(min_version, wait, part)
        else:
            published = await store.wait_for(min_version, wait)
        if published is None:
            if store.withdrawn:
                return web.Response(status=410, text=f"{self.node_id} has withdrawn: it failed and serves nothing more")
            if store.sitting_out_through >= min_version:
                return web.Response(status=404, text=f"{self.node_id} sits out round {min_version} and has published nothing yet")
            return web.Response(status=204)
        body = published.bodies.get(part)
        if body is None and part in published.addressed:
            body = published.addressed[part].get(requester)
            if body is None:
                return web.Response(status=404, text=f"{self.node_id} has no {quote(part, 40)} for {requester}")
        if body is None:
            return web.Response(status=404, text=f"{self.node_id} does not share part {quote(part, 40)}")
        frame = seal_frame(
            key=self.key, kind="model", sender=self.node_id, recipient=requester, round=published.round,
            version=published.version, seq=self.next_seq(), part=part, meta=published.meta, body=body,
        )
        timeout = self.server_limits.write_timeout_s
        try:
            response = await asyncio.wait_for(_stream(request, frame), timeout)
        except asyncio.TimeoutError:
            self.rejections.add(requester, 408, "write_timeout", f"{requester} read {quote(part, 40)} ({frame.nbytes} "
                                f"bytes) slower than the write timeout of {timeout:g} s; connection closed")
            if request.transport is not None:
                request.transport.close()
            raise ConnectionResetError("reader too slow") from None
        self.counter.sent(part, frame.nbytes, frame.param_bytes)  # counted once it has gone
        return response

    async def _read_exactly(self, request: web.Request, n: int) -> bytes:
        return await asyncio.wait_for(request.content.readexactly(n), timeout=self.server_limits.read_timeout_s)

    async def _inbox(self, request: web.Request) -> web.Response:
        """Reads and verifies the signed head before it reads the body: a sender that is not
        in the roster never makes this node hold more than a header's worth of bytes."""
        limit = self.limits.max_message_bytes
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            return self._reject(UNVERIFIED, 415, f"Content-Encoding {quote(encoding, 40)} is not accepted: send frames uncompressed",
                                kind="compressed")
        total = request.content_length
        if total is None:
            return self._reject(UNVERIFIED, 411, "a Content-Length is required", kind="no_length")
        if total > limit:
            return self._reject(UNVERIFIED, 413, f"body of {total} bytes exceeds the limit of {limit}", kind="oversized")
        sender, verified = None, False
        received = 0  # what was actually read: a rejected frame is counted by the bytes that crossed

        async def read(n: int) -> bytes:
            nonlocal received
            data = await self._read_exactly(request, n)
            received += len(data)
            return data

        try:
            prefix = await read(min(PREFIX_BYTES, total))
            head = prefix + await read(head_length(prefix, total, self.limits) - len(prefix))
            header = authenticate_head(head, total=total, roster=self.roster, recipient=self.node_id, limits=self.limits)
            sender, verified = header.sender, True
            if header.kind == GOODBYE:
                expected, schema = {}, GOODBYE_META
            else:
                expected, schema = self.expected_for(header.kind, header.part), self.meta_schema_for(header.kind, header.part)
            if expected is None:
                self.counter.received(REJECTED, received, 0)
                return self._reject(header.sender, 400, f"{self.node_id} does not accept kind={quote(header.kind, 40)} "
                                    f"part={quote(header.part, 40)}", kind="unexpected_kind")
            if schema is not None:
                check_meta(header.meta, schema)
            # A replayed or stale head is refused before its body is read; and the bodies read at
            # once share one budget, so that signed uploads held a byte short cannot pile up.
            self.replay.check(header.sender, header.seq, header.timestamp)
            body_bytes = total - len(head)
            budget = self.server_limits.max_buffered_body_bytes
            if self.buffered_body_bytes + body_bytes > budget:
                self.counter.received(REJECTED, received, 0)
                return self._reject(header.sender, 429, f"{self.buffered_body_bytes} body bytes are being read, "
                                    f"{body_bytes} more would pass the budget of {budget}; retry later",
                                    kind="body_budget")
            self.buffered_body_bytes += body_bytes
            try:
                body = await read(body_bytes)
            finally:
                self.buffered_body_bytes -= body_bytes
            message = open_message(head, body=body, roster=self.roster, recipient=self.node_id, replay=self.replay,
                                   limits=self.limits, expected=expected)
        except asyncio.IncompleteReadError as exc:
            return self._reject(sender_label(sender, verified), 400,
                                f"body ended after {len(exc.partial)} of the announced bytes", kind="truncated")
        except asyncio.TimeoutError:
            return self._reject(sender_label(sender, verified), 408,
                                f"request body not received within {self.server_limits.read_timeout_s:g} s", kind="read_timeout")
        except WireError as exc:
            self.counter.received(REJECTED, received, 0)
            return self._reject(sender_label(sender, verified), exc.status, str(exc), kind=exc.reason)
        if message.header.kind == GOODBYE:
            self.counter.received(CONTROL, message.total_bytes, 0)
            self._depart(message.header.sender, str(message.header.meta.get("reason", "")))
            return web.Response(status=202, text="accepted")
        try:
            self.on_message(message)
        except ValueError as exc:
            self.counter.received(REJECTED, message.total_bytes, 0)
            status = getattr(exc, "status", 400)
            return self._reject(message.header.sender, status, str(exc), kind=getattr(exc, "reason", "refused"))
        self.counter.received(message.header.part or message.header.kind, message.total_bytes, message.param_bytes)
        return web.Response(status=202, text="accepted")

    def _depart(self, peer: str, reason: str) -> None:
        if peer in self.departed:
            return
        self.departed[peer] = reason
        self.log.warning("%s said goodbye (%s); not waiting for it again", peer, reason or "no reason given")
        for task in self._inflight.pop(peer, set()):
            task.cancel()
        if self.on_departed is not None:
            self.on_departed(peer, reason)

    async def _status(self, request: web.Request) -> web.Response:
        return web.json_response(self.status())

    def _reject(self, sender: str, status: int, reason: str, *, kind: str = "rejected") -> web.Response:
        self.rejections.add(sender, status, kind, reason)
        return web.Response(status=status, text=reason[:1000])

    # ---- client -----------------------------------------------------------------------
    async def _read_bounded(self, response: aiohttp.ClientResponse) -> bytes:
        limit = self.limits.max_message_bytes
        if response.content_length is not None and response.content_length > limit:
            raise ValueError(f"response of {response.content_length} bytes exceeds the limit of {limit}")
        chunks, size = [], 0
        async for chunk in response.content.iter_chunked(1 << 16):
            size += len(chunk)
            if size > limit:
                raise ValueError(f"response exceeds the limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def fetch(self, peer: str, part: str, min_version: int, timeout: float) -> Message | None:
        """The earliest version >= `min_version` of the peer's `part` that it holds (else its
        latest), waiting up to `timeout` for `min_version`; None if it never answered or said
        goodbye (before or during the wait)."""
        if peer in self.departed:
            return None
        task = asyncio.ensure_future(self._fetch(peer, part, min_version, timeout))
        inflight = self._inflight.setdefault(peer, set())
        inflight.add(task)
        try:
            await asyncio.wait({task})  # unlike `await task`, returns when the task is cancelled by a goodbye
        finally:
            inflight.discard(task)
            if not task.done():  # this fetch itself was cancelled
                task.cancel()
        return None if task.cancelled() else task.result()

    async def _fetch(self, peer: str, part: str, min_version: int, timeout: float) -> Message | None:
        assert self._session is not None, "start() the endpoint first"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        backoff = self.retry_s
        url = f"{self.urls[peer]}/v1/parts/{part}"
        while (remaining := deadline - loop.time()) > 0:
            # Long waits go as several reads: a server answers one read for at most MAX_WAIT_S.
            params = {"min_version": str(min_version), "wait": f"{min(remaining, MAX_WAIT_S - 1):.3f}"}
            auth = {AUTH_HEADER: request_for(self.key, self.node_id, peer, part, min_version, self.next_seq())}
            try:
                async with self._session.get(url, params=params, headers=auth, ssl=self._ssl(peer),
                                             timeout=aiohttp.ClientTimeout(total=remaining + 10)) as resp:
                    if resp.status == 204:  # nothing published yet: the peer is still in its first round
                        await asyncio.sleep(min(backoff, max(deadline - loop.time(), 0)))
                        continue
                    if resp.status != 200:
                        self.log.warning("fetch %s/%s: HTTP %d %s", peer, part, resp.status, (await resp.text())[:200])
                        return None
                    data = await self._read_bounded(resp)
            except aiohttp.ServerFingerprintMismatch as exc:
                self._pin_mismatch(peer, exc)
                return None
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError, aiohttp.ServerDisconnectedError):
                await asyncio.sleep(min(backoff, max(deadline - loop.time(), 0)))
                backoff = min(backoff * 2, 2.0)
                continue
            except ValueError as exc:
                self.log.warning("fetch %s/%s rejected: %s", peer, part, exc)
                return None
            try:
                message = open_message(
                    data, roster=self.roster, recipient=self.node_id, replay=self.replay, limits=self.limits,
                    expected=self.expected_for("model", part),
                )
                schema = self.meta_schema_for("model", part)
                if schema is not None:
                    check_meta(message.header.meta, schema)
            except WireError as exc:
                self.counter.received(REJECTED, len(data), 0)
                self._reject(peer, exc.status, f"fetched {part}: {exc}", kind=exc.reason)
                return None
            self.counter.received(part, message.total_bytes, message.param_bytes)
            if message.header.sender != peer:
                self._reject(peer, 403, f"asked {peer} for {part} but the answer is signed by {message.header.sender}",
                             kind="wrong_sender")
                return None
            return message
        return None

    async def push(
        self, target: str, *, kind: str, part: str, round_: int, version: int,
        tensors: Mapping[str, Any], meta: Mapping[str, Any], timeout: float,
    ) -> bool:
        """Deliver one sealed message to `target`'s inbox, retrying with backoff until `timeout`."""
        assert self._session is not None, "start() the endpoint first"
        body = await asyncio.to_thread(encode_body, tensors)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        backoff = self.retry_s
        while (remaining := deadline - loop.time()) > 0:
            frame = seal(
                key=self.key, kind=kind, sender=self.node_id, recipient=target, round=round_, version=version,
                seq=self.next_seq(), part=part, meta=meta, body=body,
            )
            try:
                async with self._session.post(
                    f"{self.urls[target]}/v1/inbox", data=frame, headers={"Content-Type": CONTENT_TYPE},
                    ssl=self._ssl(target), timeout=aiohttp.ClientTimeout(total=remaining),
                ) as resp:
                    self.counter.sent(part or (CONTROL if kind == GOODBYE else kind), len(frame), body.param_bytes)
                    if resp.status == 202:
                        return True
                    self.log.warning("push to %s: HTTP %d %s", target, resp.status, (await resp.text())[:200])
                    return False
            except aiohttp.ServerFingerprintMismatch as exc:
                self._pin_mismatch(target, exc)
                return False
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError):
                await asyncio.sleep(min(backoff, max(deadline - loop.time(), 0)))
                backoff = min(backoff * 2, 5.0)
        return False

    @property
    def peers(self) -> Mapping[str, str]:
        return self.urls

    def attach(self, *, expected_for: Callable[[str, str], ExpectedSpec | None], on_message: Callable[[Message], None],
               status: Callable[[], dict[str, Any]], meta_schema_for: Callable[[str, str], Schema | None],
               on_departed: Callable[[str, str], None] | None = None) -> None:
        """Who handles what arrives: built before its node, the endpoint learns it here (before `start`)."""
        self.expected_for, self.on_message, self.status = expected_for, on_message, status
        self.meta_schema_for, self.on_departed = meta_schema_for, on_departed

    async def sit_out(self, round_: int) -> None:
        await self.store.sit_out(round_)

    async def withdraw(self) -> None:
        await self.store.withdraw()
        await self.setup_store.withdraw()

    async def say_goodbye(self, targets: list[str], reason: str, timeout: float = 3.0) -> None:
        """Tell `targets` (signed) that this node is gone, so none of them waits for it again."""
        await asyncio.gather(*(
            self.push(t, kind=GOODBYE, part="", round_=0, version=0, tensors={}, meta={"reason": reason[:500]},
                      timeout=timeout)
            for t in targets
        ))

    async def status_of(self, peer: str, timeout: float = 2.0) -> dict[str, Any] | None:
        assert self._session is not None
        try:
            async with self._session.get(f"{self.urls[peer]}/v1/status", ssl=self._ssl(peer),
                                         timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                if resp.status != 200:
                    return None
                data = await resp.read()
                self.counter.received(CONTROL, len(data), 0)
                return json.loads(data)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None

    async def _statuses(self, peers: list[str], timeout: float) -> list[dict[str, Any] | None]:
        """Every peer's status, a few polls at a time: 100 nodes sharing two processes that each
        fire 99 at once send ~10,000 requests together, which time out before they are served."""
        gate = asyncio.Semaphore(STATUS_POLLS_AT_ONCE)

        async def poll(peer: str) -> dict[str, Any] | None:
            async with gate:
                return await self.status_of(peer, timeout=timeout)

        return list(await asyncio.gather(*(poll(p) for p in peers)))

    async def wait_until_up(self, peers: set[str], seconds: float) -> set[str]:
        """Poll `peers`' status until each has answered once, or `seconds` pass; returns those still silent."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        silent = set(peers)
        backoff = self.retry_s
        while silent and loop.time() < deadline:
            names = sorted(silent)
            statuses = await self._statuses(names, max(0.1, min(STATUS_POLL_TIMEOUT_S, deadline - loop.time())))
            silent = {p for p, s in zip(names, statuses) if s is None}
            if silent:
                # Backing off: with N nodes starting together, N(N-1) polls a round would crowd out the start itself.
                await asyncio.sleep(min(backoff, max(deadline - loop.time(), 0)))
                backoff = min(backoff * 2, 4.0)
        return silent

    async def linger(self, peers: set[str], seconds: float) -> None:
        """Keep serving until every peer in `peers` reports done or stops answering, or `seconds` pass."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        pending = set(peers)
        while pending and loop.time() < deadline:
            names = sorted(pending)
            statuses = await self._statuses(names, STATUS_POLL_TIMEOUT_S)
            pending = {p for p, s in zip(names, statuses) if s is not None and not s.get("done")}
            if pending:
                await asyncio.sleep(0.5)


async def _stream(request: web.Request, frame: Frame) -> web.StreamResponse:
    """Write a sealed frame's buffers as they are: the body is never joined into one bytes object."""
    response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE})
    response.content_length = frame.nbytes
    await response.prepare(request)
    for chunk in frame.chunks:
        await response.write(chunk)
    await response.write_eof()
    return response
