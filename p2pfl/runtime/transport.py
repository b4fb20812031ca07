"""HTTP transport shared by nodes and the coordinator.

An `Endpoint` serves the latest published version of each part by long-poll GET, accepts
signed pushes on its inbox, and fetches/pushes to others. Every message that crosses it is
a sealed wire frame; every byte is counted. It knows nothing about models or algorithms:
callers give it encoded bodies and a function that says which tensors to expect.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from p2pfl.runtime.accounting import CONTROL, ByteCounter
from p2pfl.wire import (
    EncodedBody,
    Frame,
    Message,
    NodeKey,
    ReplayGuard,
    Roster,
    WireError,
    WireLimits,
    encode_body,
    open_message,
    peek_header,
    seal,
    seal_frame,
)

CONTENT_TYPE = "application/x-p2pfl"
REJECTED = "rejected"  # bytes of messages that failed validation still crossed the wire
GOODBYE = "goodbye"  # kind of the signed message a failing node sends so that nobody waits for it
ExpectedSpec = Mapping[str, tuple[tuple[int, ...], str]]


@dataclass(frozen=True)
class Published:
    version: int
    round: int
    bodies: Mapping[str, EncodedBody]
    meta: Mapping[str, Any]


class PartStore:
    """The latest published version; GETs asking for a newer one wait on the condition."""

    def __init__(self) -> None:
        self.latest: Published | None = None
        self._changed = asyncio.Condition()

    async def publish(self, published: Published) -> None:
        async with self._changed:
            self.latest = published
            self._changed.notify_all()

    async def withdraw(self) -> None:
        async with self._changed:
            self.latest = None
            self._changed.notify_all()

    async def wait_for(self, min_version: int, timeout: float) -> Published | None:
        def ready() -> bool:
            return self.latest is not None and self.latest.version >= min_version

        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(ready), timeout=max(timeout, 0.0))
            except asyncio.TimeoutError:
                pass
            return self.latest


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
        expected_for: Callable[[str, str], ExpectedSpec | None],
        on_message: Callable[[Message], None],
        status: Callable[[], dict[str, Any]],
        on_departed: Callable[[str, str], None] | None = None,
        max_skew_s: float = 300.0,
        retry_s: float = 0.25,
        log: logging.Logger | None = None,
    ) -> None:
        self.node_id = node_id
        self.key = key
        self.roster = roster
        self.urls = dict(urls)
        self.counter = counter
        self.limits = limits
        self.expected_for = expected_for
        self.on_message = on_message
        self.status = status
        self.on_departed = on_departed
        # Peers that said goodbye: fetches from them end at once, now and in later rounds.
        self.departed: dict[str, str] = {}
        self._inflight: dict[str, set[asyncio.Future[Message | None]]] = {}
        self.replay = ReplayGuard(max_skew_s=max_skew_s)
        self.retry_s = retry_s
        self.log = log or logging.getLogger(f"p2pfl.{node_id}")
        self.store = PartStore()
        self._seq = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.rejected: list[tuple[str, int, str]] = []  # (sender or '?', status, reason)

    # ---- server -----------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.limits.max_message_bytes)
        app.router.add_get("/v1/parts/{part}", self._serve_part)
        app.router.add_post("/v1/inbox", self._inbox)
        app.router.add_get("/v1/status", self._status)
        return app

    async def start(self, host: str, port: int) -> None:
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        self._session = aiohttp.ClientSession()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def next_seq(self) -> int:
        return next(self._seq)

    async def publish(self, version: int, round_: int, parts: Mapping[str, Mapping[str, Any]], meta: Mapping[str, Any]) -> None:
        """Encode each part once; every GET for this version reuses the body and only re-seals the header.

        The encoded body references the tensors' memory: `parts` must be snapshots that
        nobody changes afterwards (`p2pfl.runtime.placement.host_snapshot`)."""
        bodies = await asyncio.to_thread(lambda: {name: encode_body(t) for name, t in parts.items()})
        await self.store.publish(Published(version, round_, bodies, dict(meta)))

    async def _serve_part(self, request: web.Request) -> web.Response:
        part = request.match_info["part"]
        requester = request.query.get("requester", "")
        if requester not in self.roster:
            return self._reject(requester or "?", 403, f"unknown requester {requester!r}")
        try:
            min_version = int(request.query.get("min_version", "0"))
            wait = min(float(request.query.get("wait", "0")), 600.0)
        except ValueError:
            return self._reject(requester, 400, "min_version and wait must be numbers")
        published = await self.store.wait_for(min_version, wait)
        if published is None:
            return web.Response(status=204)
        body = published.bodies.get(part)
        if body is None:
            return web.Response(status=404, text=f"{self.node_id} does not share part {part!r}")
        frame = seal_frame(
            key=self.key, kind="model", sender=self.node_id, recipient=requester, round=published.round,
            version=published.version, seq=self.next_seq(), part=part, meta=published.meta, body=body,
        )
        self.counter.sent(part, frame.nbytes, frame.param_bytes)
        return await _stream(request, frame)

    async def _inbox(self, request: web.Request) -> web.Response:
        if request.content_length is not None and request.content_length > self.limits.max_message_bytes:
            return self._reject("?", 413, f"body of {request.content_length} bytes exceeds the limit of {self.limits.max_message_bytes}")
        try:
            data = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._reject("?", 413, f"body exceeds the limit of {self.limits.max_message_bytes} bytes")
        try:
            header = peek_header(data, self.limits)
            expected = {} if header.kind == GOODBYE else self.expected_for(header.kind, header.part)
            if expected is None:
                self.counter.received(REJECTED, len(data), 0)
                return self._reject(header.sender, 400, f"{self.node_id} does not accept kind={header.kind!r} part={header.part!r}")
            message = open_message(
                data, roster=self.roster, recipient=self.node_id, replay=self.replay, limits=self.limits, expected=expected
            )
        except WireError as exc:
            self.counter.received(REJECTED, len(data), 0)
            return self._reject("?", exc.status, str(exc))
        if message.header.kind == GOODBYE:
            self.counter.received(CONTROL, message.total_bytes, 0)
            self._depart(message.header.sender, str(message.header.meta.get("reason", ""))[:500])
            return web.Response(status=202, text="accepted")
        try:
            self.on_message(message)
        except ValueError as exc:
            self.counter.received(REJECTED, len(data), 0)
            return self._reject(message.header.sender, 400, str(exc))
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

    def _reject(self, sender: str, status: int, reason: str) -> web.Response:
        self.rejected.append((sender, status, reason))
        self.log.warning("rejected message from %s: %d %s", sender, status, reason)
        return web.Response(status=status, text=reason)

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
        """The peer's latest `part`, waiting up to `timeout` for `min_version`; None if it never
        answered or said goodbye (before or during the wait)."""
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
            params = {"requester": self.node_id, "min_version": str(min_version), "wait": f"{remaining:.3f}"}
            try:
                async with self._session.get(url, params=params, timeout=aiohttp.ClientTimeout(total=remaining + 10)) as resp:
                    if resp.status == 204:  # nothing published yet: the peer is still in its first round
                        await asyncio.sleep(min(backoff, max(deadline - loop.time(), 0)))
                        continue
                    if resp.status != 200:
                        self.log.warning("fetch %s/%s: HTTP %d %s", peer, part, resp.status, (await resp.text())[:200])
                        return None
                    data = await self._read_bounded(resp)
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
            except WireError as exc:
                self.counter.received(REJECTED, len(data), 0)
                self._reject(peer, exc.status, f"fetched {part}: {exc}")
                return None
            self.counter.received(part, message.total_bytes, message.param_bytes)
            if message.header.sender != peer:
                self._reject(peer, 403, f"asked {peer} for {part} but the answer is signed by {message.header.sender}")
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
                    timeout=aiohttp.ClientTimeout(total=remaining),
                ) as resp:
                    self.counter.sent(part or (CONTROL if kind == GOODBYE else kind), len(frame), body.param_bytes)
                    if resp.status == 202:
                        return True
                    self.log.warning("push to %s: HTTP %d %s", target, resp.status, (await resp.text())[:200])
                    return False
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError):
                await asyncio.sleep(min(backoff, max(deadline - loop.time(), 0)))
                backoff = min(backoff * 2, 5.0)
        return False

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
            async with self._session.get(f"{self.urls[peer]}/v1/status", timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                if resp.status != 200:
                    return None
                data = await resp.read()
                self.counter.received(CONTROL, len(data), 0)
                return json.loads(data)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None

    async def wait_until_up(self, peers: set[str], seconds: float) -> set[str]:
        """Poll `peers`' status until each has answered once, or `seconds` pass; returns those still silent."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        silent = set(peers)
        while silent and loop.time() < deadline:
            names = sorted(silent)
            statuses = await asyncio.gather(*(self.status_of(p, timeout=max(0.1, min(2.0, deadline - loop.time())))
                                              for p in names))
            silent = {p for p, s in zip(names, statuses) if s is None}
            if silent:
                await asyncio.sleep(min(self.retry_s, max(deadline - loop.time(), 0)))
        return silent

    async def linger(self, peers: set[str], seconds: float) -> None:
        """Keep serving until every peer in `peers` reports done or stops answering, or `seconds` pass."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        pending = set(peers)
        while pending and loop.time() < deadline:
            names = sorted(pending)
            statuses = await asyncio.gather(*(self.status_of(p) for p in names))
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
