"""The HTTP server half of an `Endpoint`: long-poll reads of published parts, the signed inbox,
and the public status. No request path answers 5xx; every refusal is logged once, rate-limited."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from p2pfl.runtime.deadline import wait_at_most
from p2pfl.runtime.rejections import UNVERIFIED, sender_label
from p2pfl.runtime.resources import release_soon
from p2pfl.runtime.transport.base import MAX_VERSION, MAX_WAIT_S, REJECTED, Refused
from p2pfl.runtime.transport.http.guard import GuardedProtocol, TlsHandshake, connection_signed_by
from p2pfl.wire import PREFIX_BYTES, Frame, WireError, authenticate_head, head_length, open_message
from p2pfl.wire.errors import quote
from p2pfl.wire.request import AUTH_HEADER, verify_request

if TYPE_CHECKING:
    from p2pfl.runtime.transport.http import Endpoint

CONTENT_TYPE = "application/x-p2pfl"
# How long a closing endpoint lets requests in flight finish (aiohttp's default is 60 s): a peer's
# long-poll read left open would otherwise hold a stopped process that long.
SHUTDOWN_GRACE_S = 2.0


class HttpServer:
    def app(self: Endpoint) -> web.Application:
        app = web.Application(client_max_size=self.limits.max_message_bytes, middlewares=[self._no_server_errors])
        app.router.add_get("/v1/parts/{part}", self._serve_part)
        app.router.add_post("/v1/inbox", self._inbox)
        app.router.add_get("/v1/status", self._status)
        app.router.add_route("*", "/v1/service/{name}", self._service)
        return app

    async def _start_server(self: Endpoint, host: str, port: int) -> None:
        # auto_decompress=False: a compressed body must be refused, not inflated by the parser first.
        self._runner = web.AppRunner(self.app(), access_log=None, keepalive_timeout=15.0, auto_decompress=False,
                                    shutdown_timeout=SHUTDOWN_GRACE_S)
        await self._runner.setup()
        self.closing = False
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        if self.tls is None:
            factory: Callable[[], asyncio.Protocol] = lambda: GuardedProtocol(server(), self)  # noqa: E731
        else:  # the handshake runs under the guard, which counts it until it ends (guard.TlsHandshake)
            factory = lambda: TlsHandshake(self, lambda: GuardedProtocol(server(), self))  # noqa: E731
        self._server = await loop.create_server(factory, host, port, reuse_address=True)

    async def _close_server(self: Endpoint) -> None:
        # A status poll that came as a node closed held its poller up to the poll's timeout (the
        # last nodes of a 1000-node run lingered 2-5 s polling neighbours that had closed), two ways:
        # * asyncio (3.11) drops a connection accepted just before the listener closes whose
        #   transport comes after, without closing its socket: the listener stops accepting
        #   first, and the connections accepted get their transports (closed at once from now
        #   on, `GuardedProtocol`) before it closes;
        # * aiohttp's shutdown ignores a request that comes after it began, and waits out the
        #   grace for a connection whose handler has not started: a connection with no request
        #   in progress is closed now. The grace is for answers being sent.
        self.closing = True
        if self._server is not None:
            loop = asyncio.get_running_loop()
            for sock in self._server.sockets:
                loop.remove_reader(sock.fileno())
            await asyncio.sleep(0)
            self._server.close()
        if self._runner is not None:
            if self._runner.server is not None:
                for handler in self._runner.server.connections:
                    if not getattr(handler, "_request_in_progress", True):
                        handler.force_close()
            await self._runner.cleanup()
        self._server, self._runner = None, None
        for connection in list(self.connections.values()):
            if connection.transport is not None:
                connection.transport.close()
        for handshake in list(self.handshaking):
            if handshake.task is not None:
                handshake.task.cancel()

    @web.middleware
    async def _no_server_errors(self: Endpoint, request: web.Request,
                                handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        """No request path answers 5xx: an exception a handler did not foresee is the request's fault."""
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:  # noqa: BLE001 - turned into a 400 with the reason
            return self._reject(UNVERIFIED, 400, f"unhandled {type(exc).__name__}: {exc}", kind="unhandled")

    async def _serve_part(self: Endpoint, request: web.Request) -> web.StreamResponse:
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
        connection_signed_by(self, request.transport, requester)
        wait_s = self.member_rates.take(requester)
        if wait_s > 0:
            return self._rate_limited(requester, wait_s)
        if self._reads_by_peer.get(requester, 0) >= self.server_limits.max_requests_per_peer:
            return self._reject(requester, 429, f"{self._reads_by_peer[requester]} reads from {requester} already waiting",
                                kind="too_many_requests")
        # A read holds its place under the cap until its answer is written, not only while it
        # waits: a reader that never reads cannot hold more than max_requests_per_peer answers.
        self._reads_by_peer[requester] = self._reads_by_peer.get(requester, 0) + 1
        try:
            try:
                frame = await self.answer_read(part, min_version, wait, requester)
            except Refused as refused:
                return web.Response(status=refused.status, text=refused.text) if refused.status != 204 \
                    else web.Response(status=204)
            timeout = self.server_limits.write_timeout_s
            try:
                response = await wait_at_most(_stream(request, frame), timeout)
            except asyncio.TimeoutError:
                self.rejections.add(requester, 408, "write_timeout", f"{requester} read {quote(part, 40)} ({frame.nbytes} "
                                    f"bytes) slower than the write timeout of {timeout:g} s; connection aborted")
                if request.transport is not None:
                    # Aborted, not closed: a graceful close waits for the write buffer to drain, which
                    # a reader that never reads never lets happen (the socket and its copy stayed).
                    request.transport.abort()
                    release_soon()  # its unsent copy is freed now; the heap gives the pages back
                raise ConnectionResetError("reader too slow") from None
            self.answered(requester, part, min_version, frame)  # counted once it has gone
            return response
        finally:
            self._reads_by_peer[requester] -= 1

    async def _service(self: Endpoint, request: web.Request) -> web.Response:
        """A service beside the node's own parts (`Carrier.services`: a federation's member
        exchange): its body (None for a GET) in, its (status, bytes) out, a few at a time."""
        name = request.match_info["name"]
        handler = self.services.get(name)
        if handler is None or request.method not in ("GET", "POST"):
            return self._reject(UNVERIFIED, 404, f"no service {quote(name, 20)} ({request.method})", kind="no_service")
        length = request.content_length
        if request.method == "POST" and (length is None or length > self.server_limits.max_service_bytes):
            return self._reject(UNVERIFIED, 413, f"service {name}: a body of at most "
                                f"{self.server_limits.max_service_bytes} bytes, with its length, is taken", kind="oversized")
        async with self.service_gate:
            body = await self._read_exactly(request, length) if request.method == "POST" and length else (
                b"" if request.method == "POST" else None)
            status, answer = await handler(body)
        if status != 200:
            self.rejections.add(UNVERIFIED, status, name, f"service {name}: {answer[:200].decode(errors='replace')}")
        return web.Response(status=status, body=answer, content_type="application/msgpack" if status == 200 else "text/plain")

    async def _read_exactly(self: Endpoint, request: web.Request, n: int) -> bytes:
        return await wait_at_most(request.content.readexactly(n), timeout=self.server_limits.read_timeout_s)

    async def _inbox(self: Endpoint, request: web.Request) -> web.Response:
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
            # A kind not taken, or a replayed or stale head, is refused before its body is read, and
            # before anything is charged to its signer: a head anyone saw on the wire (plain HTTP)
            # and replays must not spend the signer's tokens nor make a connection count as its.
            expected = self.accepted(header)
            # One head per sequence number: the replay guard records a seq once its frame is whole,
            # so heads sharing one would otherwise each hold a place while their bodies come.
            if (header.sender, header.seq) in self.reading_seqs:
                self.counter.received(REJECTED, received, 0)
                return self._reject(header.sender, 409, f"seq {header.seq} of {header.sender} is already being read",
                                    kind="replayed")
            connection_signed_by(self, request.transport, header.sender)
            wait_s = self.member_rates.take(header.sender)
            if wait_s > 0:
                self.counter.received(REJECTED, received, 0)
                return self._rate_limited(header.sender, wait_s)
            # The bodies read at once share one budget, so signed uploads held a byte short cannot pile up.
            body_bytes = total - len(head)
            budget = self.server_limits.max_buffered_body_bytes
            # Each member's share of the budget (at least one message's worth): one member's heads
            # whose bodies never come cannot take what the others' pushes need.
            share = max(self.limits.max_message_bytes, budget // max(1, len(self.roster)))
            held = self.buffered_by_sender.get(header.sender, 0)
            if held + body_bytes > share or self.buffered_body_bytes + body_bytes > budget:
                self.counter.received(REJECTED, received, 0)
                return self._reject(header.sender, 429, f"{header.sender} has {held} body bytes being read (its share "
                                    f"{share}), all {self.buffered_body_bytes} (budget {budget}); {body_bytes} more "
                                    "would pass; retry later", kind="body_budget")
            self.buffered_body_bytes += body_bytes
            self.buffered_by_sender[header.sender] = held + body_bytes
            self.reading_seqs.add((header.sender, header.seq))
            try:
                body = await read(body_bytes)
            finally:
                self.buffered_body_bytes -= body_bytes
                self.reading_seqs.discard((header.sender, header.seq))
                left = self.buffered_by_sender[header.sender] - body_bytes
                if left:
                    self.buffered_by_sender[header.sender] = left
                else:
                    del self.buffered_by_sender[header.sender]
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
        status, text = self.take(message)
        return web.Response(status=status, text=text)

    async def _status(self: Endpoint, request: web.Request) -> web.Response:
        return web.json_response(self.status())

    def _rate_limited(self: Endpoint, member: str, wait_s: float) -> web.Response:
        limits = self.server_limits
        response = self._reject(member, 429, f"{member} is over {limits.requests_per_s_per_peer:g} signed requests a "
                                f"second (burst {limits.request_burst_per_peer:g}); retry in {wait_s:.2f} s",
                                kind="rate_limited")
        response.headers["Retry-After"] = str(max(1, round(wait_s)))
        return response

    def _reject(self: Endpoint, sender: str, status: int, reason: str, *, kind: str = "rejected") -> web.Response:
        self.rejections.add(sender, status, kind, reason)
        return web.Response(status=status, text=reason[:1000])


async def _stream(request: web.Request, frame: Frame) -> web.StreamResponse:
    """Write a sealed frame's buffers as they are: the body is never joined into one bytes object."""
    response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE})
    response.content_length = frame.nbytes
    await response.prepare(request)
    for chunk in frame.chunks:
        await response.write(chunk)
    await response.write_eof()
    return response
