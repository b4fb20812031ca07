"""How members find each other and hear of revocations: one exchange over HTTP, used three ways.

* **Discovery**: a starting node sends its record to its seed addresses and takes the members
  each seed knows. A node none of whose seeds answers stops with one line naming each seed and
  what it answered (`NoSeedAnswered`).
* **Gossip**: every `period_s` a node exchanges with a few members drawn at random (push-pull:
  each side takes what the other knows), so a member admitted anywhere is known everywhere.
* **Flooding revocations**: a node that takes a newer revocation list passes it to every member
  it knows at once, so a revoked member is refused everywhere within one gossip period.

An exchange is a POST of msgpack to `/v1/service/federation` (the carrier's service route); the
answer is msgpack too. Everything in it is signed by a member or by the federation, so the
exchange itself needs no signature; a payload whose sender's record is refused is answered 403
with the cause.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import aiohttp
import msgpack

from p2pfl.runtime.federation.certificates import MALFORMED, REVOKED, Refused
from p2pfl.runtime.federation.directory import Directory
from p2pfl.runtime.deadline import wait_at_most
from p2pfl.runtime.transport.limits import read_bounded
from p2pfl.wire.body import unpack_strict

SERVICE = "federation"
PATH = f"/v1/service/{SERVICE}"
MAX_EXCHANGE_BYTES = 4 << 20
PAYLOAD_FIELDS = ("from", "records", "revocations")
FANOUT = 2  # members a node exchanges with each period


class NoSeedAnswered(Exception):
    """No seed admitted this node; `tried` is seed -> what it answered."""

    def __init__(self, tried: Mapping[str, str]) -> None:
        self.tried = dict(tried)
        super().__init__("no seed admitted this node: " + "; ".join(f"{s}: {why}" for s, why in self.tried.items()))


def encode(payload: Mapping[str, Any]) -> bytes:
    return msgpack.packb(dict(payload), use_bin_type=True)


def decode(body: bytes) -> dict[str, Any]:
    if len(body) > MAX_EXCHANGE_BYTES:
        raise Refused(MALFORMED, f"exchange of {len(body)} bytes, over {MAX_EXCHANGE_BYTES}")
    try:
        payload = unpack_strict(body)
    except Exception as exc:  # msgpack raises several unrelated types
        raise Refused(MALFORMED, f"exchange is not msgpack: {str(exc)[:80]}") from None
    if not isinstance(payload, dict) or not set(payload) <= set(PAYLOAD_FIELDS):
        raise Refused(MALFORMED, f"an exchange is a map of {', '.join(PAYLOAD_FIELDS)}")
    if payload.get("records") is not None and not isinstance(payload["records"], list):
        raise Refused(MALFORMED, "records: expected a list")
    if payload.get("revocations") is not None and not isinstance(payload["revocations"], dict):
        raise Refused(MALFORMED, "revocations: expected a map")
    return payload


class Gossip:
    def __init__(self, directory: Directory, *, period_s: float = 2.0, timeout_s: float = 5.0, seed: int = 0,
                 log: logging.Logger | None = None) -> None:
        self.directory, self.period_s, self.timeout_s = directory, period_s, timeout_s
        self.rng = random.Random(seed)
        self.log = log or directory.log
        self.session: aiohttp.ClientSession | None = None
        # Once its node listens, exchanges go out through the node's carrier (`PeerDirectory.caller`):
        # counted with the node's bytes, bounded by its limits. Discovery, before the node, uses a
        # session of its own.
        self.call: Callable[[str, bytes, int], Awaitable[tuple[int, bytes]]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._floods: set[asyncio.Task[None]] = set()
        self.exchanges = 0  # made by this node (for its result)
        self.refused_by = ""  # the first member that refused this node's own record, and why

    # ---- serving ------------------------------------------------------------------------------
    async def handle(self, body: bytes) -> tuple[int, bytes]:
        """A peer's exchange: (status, answer). 403 naming the cause if its own record is refused."""
        try:
            payload = decode(body)
            newer, _ = self.directory.take(payload)
        except Refused as refused:
            if refused.cause == REVOKED:  # told why, in a form it can check: the federation's signed list
                return 403, json.dumps({"refused": f"{refused.cause}: {refused.detail}",
                                        "revocations": self.directory.revocations.to_dict()}).encode()
            return 403, f"{refused.cause}: {refused.detail}".encode()
        if newer:
            self.flood()
        # A flood (no "records") is answered with the revocations only: every member flooding every
        # other used to answer each with its whole member list, N² lists that held up gossip for seconds.
        return 200, encode(self.directory.payload(with_records="records" in payload))

    # ---- reaching out -------------------------------------------------------------------------
    async def _session(self) -> aiohttp.ClientSession:
        if self.session is None:
            self.session = aiohttp.ClientSession()
        return self.session

    async def exchange(self, url: str, payload: Mapping[str, Any] | None = None) -> bool:
        """One exchange with `url`; True if it answered and its answer was taken. Raises
        `ExchangeFailed` with what it answered otherwise."""
        body = encode(payload if payload is not None else self.directory.payload())

        async def post() -> tuple[int, bytes]:
            if self.call is not None:
                return await self.call(url.rstrip("/") + PATH, body, MAX_EXCHANGE_BYTES)
            session = await self._session()
            # Unpinned TLS (an https seed is known by its address only): what an exchange carries is
            # signed by members and the federation, so a man in the middle can withhold, not forge.
            async with session.post(url.rstrip("/") + PATH, data=body, ssl=False,
                                    headers={"Content-Type": "application/msgpack"}) as response:
                return response.status, await read_bounded(response, MAX_EXCHANGE_BYTES)

        try:
            status, answer = await wait_at_most(post(), self.timeout_s)
        except asyncio.TimeoutError:
            raise ExchangeFailed(f"no answer within {self.timeout_s:g} s") from None
        except aiohttp.ClientError as exc:
            raise ExchangeFailed(_reason(exc)) from None
        except ValueError as exc:  # the answer is larger than an exchange may be
            raise ExchangeFailed(f"answered with what this node refuses: {exc}", final=True) from None
        if status != 200:
            self._told_revoked(status, answer)
            raise ExchangeFailed(f"refused this node: {status} {answer[:200].decode(errors='replace')}", final=True)
        try:
            newer, _ = self.directory.take(decode(answer))
        except Refused as refused:
            raise ExchangeFailed(f"answered with what this node refuses: {refused}", final=True) from None
        self.exchanges += 1
        if newer:
            self.flood()
        return True

    def _told_revoked(self, status: int, answer: bytes) -> None:
        """A 403 that names this node revoked carries the federation's signed list: taken if it
        verifies (a member cannot make another stop by saying so)."""
        if status != 403 or not answer.startswith(b"{"):
            return
        try:
            told = json.loads(answer)
            self.directory.offer_revocations(told["revocations"])
        except (ValueError, KeyError, TypeError, Refused):
            return

    async def discover(self, seeds: Sequence[str], wait_s: float) -> None:
        """Exchange with every seed (but this node's own address) until one admits this node,
        trying the unreachable ones again each second for `wait_s`: NoSeedAnswered naming each
        seed's answer once every seed has refused or `wait_s` has passed."""
        others = [s.rstrip("/") for s in seeds if s.rstrip("/") != (self.directory.own.url or "")]
        if not others:
            return  # this node is the seed: the others find it
        tried: dict[str, ExchangeFailed] = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            pending = [seed for seed in others if seed not in tried or not tried[seed].final]
            results = await asyncio.gather(*(self._try(seed) for seed in pending))
            if any(failed is None for failed in results):
                return
            for seed, failed in zip(pending, results):
                if seed not in tried and failed is not None and not failed.final:  # no silent wait
                    self.log.warning("seed %s: %s; trying again each second for up to %.0f s (seed_wait_s)",
                                     seed, failed, wait_s)
                tried[seed] = failed  # type: ignore[assignment]
            if loop.time() >= deadline or all(tried[seed].final for seed in others):
                raise NoSeedAnswered({seed: str(tried[seed]) for seed in others})
            await asyncio.sleep(min(1.0, max(0.0, deadline - loop.time())))

    async def _try(self, url: str) -> ExchangeFailed | None:
        try:
            await self.exchange(url)
        except ExchangeFailed as failed:
            return failed
        return None

    async def announce(self) -> None:
        """One exchange with every member known (who then know this node), all at once."""
        await asyncio.gather(*(self._try(url) for url in self.directory.reachable().values()))

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._every_period())

    async def _every_period(self) -> None:
        """At a fixed rate (a slow exchange does not push the next one later): an outbound-only
        member, whom no flood reaches, hears of a revocation within a period and an exchange."""
        loop = asyncio.get_running_loop()
        tick = loop.time()
        while True:
            tick += self.period_s
            await asyncio.sleep(max(0.0, tick - loop.time()))
            self.directory.expire()
            members = list(self.directory.reachable().items())
            await asyncio.gather(*(self._gossip_with(url) for _, url in self.rng.sample(members, min(FANOUT, len(members)))))

    async def _gossip_with(self, url: str) -> None:
        try:
            await self.exchange(url)
        except ExchangeFailed as failed:
            if failed.final and not self.refused_by:  # this node itself is out: say so once, loudly
                self.refused_by = f"{url}: {failed}"
                self.log.error("a member refuses this node (%s); its parts are no longer taken", self.refused_by)
            self.log.debug("gossip with %s: %s", url, failed)

    def flood(self) -> None:
        """Pass the newest revocation list to every member known, now (not waited for)."""
        payload = {"from": self.directory.own.to_dict(), "revocations": self.directory.revocations.to_dict()}

        async def tell(url: str) -> None:
            try:
                await self.exchange(url, payload)
            except ExchangeFailed as failed:
                self.log.debug("passing revocations to %s: %s", url, failed)

        for url in self.directory.reachable().values():
            task = asyncio.ensure_future(tell(url))
            self._floods.add(task)
            task.add_done_callback(self._floods.discard)

    async def close(self) -> None:
        tasks = [t for t in [self._task, *self._floods] if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.session is not None:
            await self.session.close()
            self.session = None


class ExchangeFailed(Exception):
    """An exchange that did not happen; `final` when the other side answered (a refusal: asking
    again changes nothing), not when it could not be reached."""

    def __init__(self, reason: str, *, final: bool = False) -> None:
        super().__init__(reason)
        self.final = final


def _reason(exc: aiohttp.ClientError) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError):
        return f"cannot connect ({exc.os_error.strerror or exc.os_error})"
    return f"{type(exc).__name__}: {exc}"[:200]


__all__ = ["FANOUT", "PATH", "SERVICE", "ExchangeFailed", "Gossip", "NoSeedAnswered", "decode", "encode"]
