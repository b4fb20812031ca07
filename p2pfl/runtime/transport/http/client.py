"""The HTTP client half of an `Endpoint`: signed long-poll reads of a peer's parts, pushes to its
inbox with back-off, and status polls. Every answer is verified before anyone sees it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from urllib.parse import quote

import aiohttp
from yarl import URL

from p2pfl.runtime.accounting import CONTROL
from p2pfl.runtime.deadline import wait_at_most
from p2pfl.runtime.transport.base import GOODBYE, MAX_WAIT_S
from p2pfl.runtime.transport.http.server import CONTENT_TYPE
from p2pfl.runtime.transport.limits import read_bounded
from p2pfl.wire import Message, encode_body, seal
from p2pfl.wire.request import AUTH_HEADER, request_for

if TYPE_CHECKING:
    from p2pfl.runtime.transport.http import Endpoint


CLOSE = {"Connection": "close"}


class HttpClient:
    def _pin_mismatch(self: Endpoint, peer: str, exc: aiohttp.ServerFingerprintMismatch) -> None:
        """Whoever answered at `peer`'s address is not `peer`: nothing was sent, nothing is retried."""
        self.rejections.add(peer, 495, "tls_pin_mismatch",
                            f"TLS certificate at {self.urls[peer]} has fingerprint {exc.got.hex()}, the roster pins "
                            f"{exc.expected.hex()}")

    def _ssl(self: Endpoint, peer: str) -> aiohttp.Fingerprint | bool:
        """The pin of `peer`'s certificate; without one, a TLS URL needs a CA-verified certificate."""
        return self._pins.get(peer, True)

    async def _fetch(self: Endpoint, peer: str, part: str, min_version: int, timeout: float) -> Message | None:
        assert self._session is not None, "start() the endpoint first"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        backoff = self.retry_s
        url = self.urls.get(peer)
        if url is None:  # taken out (revoked, expired) between the fetch's decision and now: nothing to read
            return None
        base = f"{url}/v1/parts/{quote(part, safe='')}?min_version={int(min_version)}&wait="
        while (remaining := deadline - loop.time()) > 0:
            # Long waits go as several reads: a server answers one read for at most MAX_WAIT_S.
            # The query is written out and handed over encoded: yarl's query building was a tenth
            # of a 1000-node worker's time.
            url = URL(f"{base}{min(remaining, MAX_WAIT_S - 1):.3f}", encoded=True)
            auth = {AUTH_HEADER: request_for(self.key, self.node_id, peer, part, min_version, self.next_seq())}
            try:
                async with self._session.get(url, headers=auth, ssl=self._ssl(peer),
                                             timeout=aiohttp.ClientTimeout(total=remaining + 10)) as resp:
                    if resp.status == 204:  # nothing published yet: the peer is still in its first round
                        await asyncio.sleep(min(backoff, max(deadline - loop.time(), 0)))
                        continue
                    if resp.status in RETRY_LATER:  # over the peer's rate or cap for now: wait as it says
                        after = float(resp.headers.get("Retry-After", backoff)) if resp.headers.get(
                            "Retry-After", "").isdigit() else backoff
                        await asyncio.sleep(min(max(after, backoff), max(deadline - loop.time(), 0)))
                        backoff = min(backoff * 2, 2.0)
                        continue
                    if resp.status != 200:
                        self.log.warning("fetch %s/%s: HTTP %d %s", peer, part, resp.status, (await resp.text())[:200])
                        return None
                    data = await read_bounded(resp, self.limits.max_message_bytes)
            except aiohttp.ServerFingerprintMismatch as exc:
                self._pin_mismatch(peer, exc)
                return None
            except aiohttp.ClientConnectorError as exc:
                if _refused(exc):  # a closed port is an answer: nobody serves there now (crashed, restarting, gone)
                    return None
                await asyncio.sleep(min(backoff, max(deadline - loop.time(), 0)))
                backoff = min(backoff * 2, 2.0)
                continue
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError,
                    asyncio.IncompleteReadError):  # the connection closed before the declared length (the peer died)
                await asyncio.sleep(min(backoff, max(deadline - loop.time(), 0)))
                backoff = min(backoff * 2, 2.0)
                continue
            except (ValueError, aiohttp.ClientError) as exc:  # too large, or not an HTTP answer at all
                self.log.warning("fetch %s/%s rejected: %s", peer, part, exc)
                return None
            return self.opened_answer(peer, part, data)
        return None

    async def push(
        self: Endpoint, target: str, *, kind: str, part: str, round_: int, version: int,
        tensors: Mapping[str, Any], meta: Mapping[str, Any], timeout: float,
    ) -> bool:
        """Deliver one sealed message to `target`'s inbox, retrying with backoff until `timeout`."""
        assert self._session is not None, "start() the endpoint first"
        body = await asyncio.to_thread(encode_body, tensors)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        backoff = self.retry_s
        while (remaining := deadline - loop.time()) > 0:
            url = self.urls.get(target)
            if url is None:  # taken out meanwhile (revoked), or never reachable (outbound only)
                return False
            frame = seal(
                key=self.key, kind=kind, sender=self.node_id, recipient=target, round=round_, version=version,
                seq=self.next_seq(), part=part, meta=meta, body=body,
            )
            try:
                async with self._session.post(
                    f"{url}/v1/inbox", data=frame, headers={"Content-Type": CONTENT_TYPE},
                    ssl=self._ssl(target), timeout=aiohttp.ClientTimeout(total=remaining),
                ) as resp:
                    self.counter.sent(part or (CONTROL if kind == GOODBYE else kind), len(frame), body.param_bytes)
                    if resp.status == 202:
                        return True
                    text = (await resp.text())[:200]
                    if resp.status in RETRY_LATER:  # the receiver is busy reading others: try again, a new seq
                        self.log.info("push to %s: HTTP %d %s; retrying", target, resp.status, text)
                        await asyncio.sleep(min(backoff, max(deadline - loop.time(), 0)))
                        backoff = min(backoff * 2, 5.0)
                        continue
                    self.log.warning("push to %s: HTTP %d %s", target, resp.status, text)
                    return False
            except aiohttp.ServerFingerprintMismatch as exc:
                self._pin_mismatch(target, exc)
                return False
            except aiohttp.ClientConnectorError as exc:
                if _refused(exc):
                    return False
                await asyncio.sleep(min(backoff, max(deadline - loop.time(), 0)))
                backoff = min(backoff * 2, 5.0)
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError):
                await asyncio.sleep(min(backoff, max(deadline - loop.time(), 0)))
                backoff = min(backoff * 2, 5.0)
            except aiohttp.ClientError as exc:  # not an HTTP answer at all: whoever answered is no inbox
                self.log.warning("push to %s rejected: %s", target, exc)
                return False
        return False

    async def call(self: Endpoint, url: str, body: bytes, limit: int) -> tuple[int, bytes]:
        """POST `body` to another member's service at `url` (`/v1/service/{name}`) over this
        carrier's session: its bytes are counted as control, its answer read to at most `limit`
        bytes (ValueError above it). Unpinned TLS: what a service answers is signed by members."""
        assert self._session is not None, "start() the endpoint first"
        async with self._session.post(url, data=body, ssl=False,
                                      headers={"Content-Type": "application/msgpack"}) as response:
            self.counter.sent(CONTROL, len(body), 0)
            answer = await read_bounded(response, limit)
        self.counter.received(CONTROL, len(answer), 0)
        return response.status, answer

    async def status_of(self: Endpoint, peer: str, timeout: float = 2.0) -> dict[str, Any] | None:
        assert self._session is not None
        if peer not in self.urls:  # a member nobody can reach (outbound only), or one taken out
            return None
        try:
            # A status poll's connection is not kept for reuse (`Connection: close`): at start-up
            # a node polls every neighbour, and 500 nodes of a 20-regular graph in one process
            # kept 10,000 idle connections (both ends: 20,000 sockets), past the open-file limit.
            async with self._session.get(f"{self.urls[peer]}/v1/status", ssl=self._ssl(peer), headers=CLOSE,
                                         timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                if resp.status != 200:
                    return None
                data = await resp.read()
                self.counter.received(CONTROL, len(data), 0)
                return json.loads(data)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return None

    async def is_up(self: Endpoint, peer: str, timeout: float) -> bool:
        """A peer is up once its port takes a connection (a node listens only once its worker has
        built it): no request, so no answer to wait for. A status poll waited for one: a
        10,000-node worker busy with round 1 answered too late, and 1400-1700 nodes of the other
        waited the whole `runtime.start_wait_s` for it."""
        if peer not in self.urls:
            return False
        url = URL(self.urls[peer])
        try:
            _, writer = await wait_at_most(asyncio.open_connection(url.host, url.port), timeout)
        except (OSError, asyncio.TimeoutError):
            return False
        writer.close()
        return True


# Answers that say "not now" (the inbox's budget is taken, or the connection cap): before, a push
# given one was dropped, so one member filling a coordinator's budget kept the others out of a round.
RETRY_LATER = frozenset({429, 503})


def _refused(exc: aiohttp.ClientConnectorError) -> bool:
    """The peer's host answered that nothing listens on its port (RST): unlike a silent host, worth no wait."""
    return isinstance(exc.os_error, ConnectionRefusedError)
