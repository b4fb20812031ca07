"""Frames handed over in memory between nodes of one process (`runtime.transport = "loopback"`).

Every frame is sealed, signed and verified exactly as over HTTP (read tokens, replay guard,
expected tensors, meta schema, the per-reader cap), and counted at its frame size, so a run's
bytes and rejections are those of the HTTP carrier; only sockets, HTTP parsing and the
connection guard are gone. Nodes find each other by the address in their roster
("host:port", as the launcher writes it), in a directory of this process and event loop: a
peer in another process is unreachable, so the scenario layer allows loopback only where every
node shares one process and event loop (placement "shared" with one worker, and tests).
`InMemory` is that handing-over on its own; the "colocated" carrier
(`p2pfl.runtime.transport.colocated`) uses it for the peers of its process and HTTP for the rest.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from p2pfl.runtime.accounting import CONTROL
from p2pfl.runtime.rejections import UNVERIFIED, sender_label
from p2pfl.runtime.transport.base import GOODBYE, MAX_WAIT_S, REJECTED, Carrier, Refused
from p2pfl.wire import PREFIX_BYTES, Message, WireError, authenticate_head, encode_body, head_length, open_message, seal
from p2pfl.wire.errors import quote
from p2pfl.wire.request import request_for, verify_request

# event loop -> "host:port" -> the started carrier there: a carrier on another loop (a test's
# second thread) awaits futures this loop cannot, so it is as far away as another process.
_DIRECTORY: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, InMemory]] = weakref.WeakKeyDictionary()


def address_of(url: str) -> str:
    """The directory key of a roster URL ("http://h:p", "loopback://h:p" or "h:p")."""
    return urlsplit(url if "://" in url else f"loopback://{url}").netloc


class InMemory(Carrier):
    """Serving and reaching the carriers of this process's directory: the moves of a carrier
    whose medium is memory, each judged and counted as the HTTP carrier judges and counts it."""

    address: str | None = None
    _directory: dict[str, InMemory] | None = None

    def _register(self, host: str, port: int) -> None:
        directory = _DIRECTORY.setdefault(asyncio.get_running_loop(), {})
        address = f"{host}:{port}"
        if address in directory:
            raise OSError(f"loopback address {address} is in use by {directory[address].node_id}")
        directory[address] = self
        self.address, self._directory = address, directory

    def _unregister(self) -> None:
        if self.address is not None and self._directory is not None and self._directory.get(self.address) is self:
            del self._directory[self.address]
        self.address = self._directory = None

    def _in_memory(self, peer: str) -> InMemory | None:
        """The started carrier of `peer` in this process and on this event loop, if there is one."""
        url = self.urls.get(peer)
        directory = _DIRECTORY.get(asyncio.get_running_loop())
        return None if url is None or directory is None else directory.get(address_of(url))

    # ---- what the other side does -----------------------------------------------------
    async def serve_read(self, token: str, part: str, min_version: int, wait: float) -> bytes:
        """A signed read of `part`: the sealed frame's bytes, or `Refused` (status, text)."""
        try:
            signed = verify_request(token, roster=self.roster, target=self.node_id, part=part,
                                    min_version=min_version, replay=self.replay)
        except WireError as exc:
            self.rejections.add(UNVERIFIED, exc.status, exc.reason, f"read of {quote(part, 20)}: {exc}")
            raise Refused(exc.status, str(exc)) from None
        requester = signed.requester
        if self._reads_by_peer.get(requester, 0) >= self.server_limits.max_requests_per_peer:
            reason = f"{self._reads_by_peer[requester]} reads from {requester} already waiting"
            self.rejections.add(requester, 429, "too_many_requests", reason)
            raise Refused(429, reason)
        self._reads_by_peer[requester] = self._reads_by_peer.get(requester, 0) + 1
        try:
            frame = await self.answer_read(part, min_version, wait, requester)
        finally:
            self._reads_by_peer[requester] -= 1
        data = b"".join(frame.chunks)  # one copy: the chunks are buffers of the published body
        self.answered(requester, part, min_version, frame)
        return data

    def receive(self, frame: bytes) -> tuple[int, str]:
        """A pushed frame, judged as the HTTP inbox judges it: (status, text)."""
        total, sender, verified = len(frame), None, False
        if total > self.limits.max_message_bytes:
            return self._refuse(UNVERIFIED, 413, f"body of {total} bytes exceeds the limit of "
                                f"{self.limits.max_message_bytes}", "oversized")
        try:
            prefix = frame[:PREFIX_BYTES]
            head = frame[:head_length(prefix, total, self.limits)]
            header = authenticate_head(head, total=total, roster=self.roster, recipient=self.node_id, limits=self.limits)
            sender, verified = header.sender, True
            expected = self.accepted(header)
            message = open_message(head, body=frame[len(head):], roster=self.roster, recipient=self.node_id,
                                   replay=self.replay, limits=self.limits, expected=expected)
        except WireError as exc:
            self.counter.received(REJECTED, total, 0)
            return self._refuse(sender_label(sender, verified), exc.status, str(exc), exc.reason)
        return self.take(message)

    def _refuse(self, sender: str, status: int, reason: str, kind: str) -> tuple[int, str]:
        self.rejections.add(sender, status, kind, reason)
        return status, reason[:1000]

    # ---- what this side does ----------------------------------------------------------
    async def _fetch_in_memory(self, peer: str, part: str, min_version: int, timeout: float) -> Message | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        backoff = self.retry_s
        while (remaining := deadline - loop.time()) > 0:
            target = self._in_memory(peer)
            if target is None:  # nobody at its address (not started, crashed, gone): a refused connection, no wait
                return None
            token = request_for(self.key, self.node_id, peer, part, min_version, self.next_seq())
            try:
                data = await target.serve_read(token, part, min_version, min(remaining, MAX_WAIT_S - 1))
            except Refused as refused:
                if refused.status == 204:  # nothing published yet
                    await asyncio.sleep(min(backoff, max(deadline - loop.time(), 0)))
                    continue
                self.log.warning("fetch %s/%s: HTTP %d %s", peer, part, refused.status, refused.text[:200])
                return None
            if len(data) > self.limits.max_message_bytes:
                self.log.warning("fetch %s/%s rejected: response exceeds the limit of %d bytes", peer, part,
                                 self.limits.max_message_bytes)
                return None
            return self.opened_answer(peer, part, data)
        return None

    async def _push_in_memory(self, target: str, *, kind: str, part: str, round_: int, version: int,
                              tensors: Mapping[str, Any], meta: Mapping[str, Any], timeout: float) -> bool:
        """One hand-over: a carrier in memory answers at once, and an absent one is a refused connection."""
        body = await asyncio.to_thread(encode_body, tensors)
        peer = self._in_memory(target)
        if peer is None:
            return False
        frame = seal(key=self.key, kind=kind, sender=self.node_id, recipient=target, round=round_, version=version,
                     seq=self.next_seq(), part=part, meta=meta, body=body)
        self.counter.sent(part or (CONTROL if kind == GOODBYE else kind), len(frame), body.param_bytes)
        status, text = peer.receive(frame)
        if status == 202:
            return True
        self.log.warning("push to %s: HTTP %d %s", target, status, text[:200])
        return False

    def _status_in_memory(self, peer: str) -> dict[str, Any] | None:
        target = self._in_memory(peer)
        if target is None:
            return None
        data = json.dumps(target.status()).encode()
        self.counter.received(CONTROL, len(data), 0)
        return json.loads(data)


class LoopbackCarrier(InMemory):
    async def start(self, host: str, port: int) -> None:
        self._listen_at = (host, port)
        self._register(host, port)

    async def listen(self) -> None:
        self._register(*self._listen_at)

    async def stop_listening(self) -> None:
        await self.withdraw()
        self._unregister()

    async def close(self) -> None:
        self._unregister()

    async def _fetch(self, peer: str, part: str, min_version: int, timeout: float) -> Message | None:
        return await self._fetch_in_memory(peer, part, min_version, timeout)

    async def push(self, target: str, *, kind: str, part: str, round_: int, version: int,
                   tensors: Mapping[str, Any], meta: Mapping[str, Any], timeout: float) -> bool:
        return await self._push_in_memory(target, kind=kind, part=part, round_=round_, version=version,
                                          tensors=tensors, meta=meta, timeout=timeout)

    def answers_locally(self, peer: str) -> bool:
        return True

    async def status_of(self, peer: str, timeout: float = 2.0) -> dict[str, Any] | None:
        return self._status_in_memory(peer)
