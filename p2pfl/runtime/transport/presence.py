"""Waiting for peers by their status: until they are up at the start, and until they are done
at the end. A carrier supplies `status_of` (one poll) and `readers_so_far` (the peers whose
signed reads it has answered)."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

T = TypeVar("T")

STATUS_POLLS_AT_ONCE = 8  # per node, while waiting for peers to come up
# ... and per process: 500 nodes of a 20-regular graph, 8 polls each, would hold 8,000 sockets
# in flight in one worker (twice that with the serving ends) near the open-file limit.
STATUS_POLLS_PER_PROCESS = 512
STATUS_POLL_TIMEOUT_S = 5.0
_PROCESS_GATES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def _process_gate() -> asyncio.Semaphore:
    """The status-poll gate every carrier on this event loop (the nodes a worker hosts) shares."""
    loop = asyncio.get_running_loop()
    gate = _PROCESS_GATES.get(loop)
    if gate is None:
        gate = _PROCESS_GATES[loop] = asyncio.Semaphore(STATUS_POLLS_PER_PROCESS)
    return gate


class PeerPresence:
    retry_s: float

    async def status_of(self, peer: str, timeout: float = 2.0) -> dict[str, Any] | None:
        raise NotImplementedError

    def readers_so_far(self) -> Iterable[str]:
        raise NotImplementedError

    def answers_locally(self, peer: str) -> bool:
        """Whether `peer`'s status is read in this process, at once and without a socket."""
        return False

    async def is_up(self, peer: str, timeout: float) -> bool:
        """Whether `peer` is up: here, it answers a status poll; over HTTP, its port takes a
        connection (`HttpClient.is_up`: a process too busy to answer in time is up all the same)."""
        return await self.status_of(peer, timeout=timeout) is not None

    async def _statuses(self, peers: list[str], timeout: float) -> list[dict[str, Any] | None]:
        """Every peer's status, a few polls at a time: 100 nodes sharing two processes that each
        fire 99 at once send ~10,000 requests together, which time out before they are served."""
        return await self._gated(peers, lambda peer: self.status_of(peer, timeout=timeout))

    async def _gated(self, peers: list[str], ask: Callable[[str], Awaitable[T]]) -> list[T]:
        """`ask` of each peer under the node's and the process's gates. A status read in this
        process passes them: queued behind polls of a busy process (up to their timeout each),
        the nodes of a 10,000-node worker whose neighbours were all beside them began round 1 up
        to a minute late."""
        gate, shared = asyncio.Semaphore(STATUS_POLLS_AT_ONCE), _process_gate()

        async def poll(peer: str) -> T:
            if self.answers_locally(peer):
                return await ask(peer)
            async with gate, shared:
                return await ask(peer)

        return list(await asyncio.gather(*(poll(p) for p in peers)))

    async def wait_until_up(self, peers: set[str], seconds: float) -> set[str]:
        """Poll `peers` until each is up (`is_up`) or has read from this node (a signed read shows
        it up), or `seconds` pass; returns those still silent. Before, a peer had to answer a poll
        in time: 1400-1700 of a 10,000-node run's nodes waited the whole `runtime.start_wait_s`
        for neighbours in the other worker, whose process was busy with round 1."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        silent = set(peers)
        backoff = self.retry_s
        while silent and loop.time() < deadline:
            silent -= set(self.readers_so_far())
            if not silent:
                break
            names = sorted(silent)
            timeout = max(0.1, min(STATUS_POLL_TIMEOUT_S, deadline - loop.time()))
            ups = await self._gated(names, lambda peer, wait=timeout: self.is_up(peer, wait))
            silent = {p for p, up in zip(names, ups) if not up}
            if silent:
                # Backing off: with N nodes starting together, N(N-1) polls a round would crowd out the start itself.
                await asyncio.sleep(min(backoff, max(deadline - loop.time(), 0)))
                backoff = min(backoff * 2, 4.0)
        return silent

    async def linger(self, peers: set[str], seconds: float, not_up_yet: Iterable[str] = ()) -> None:
        """Keep serving until every peer in `peers` reports done or stops answering, or `seconds` pass.
        A peer in `not_up_yet` has not answered this node so far: its silence means it is still
        starting, not that it stopped, so it is waited for until it answers or reads from this node
        once (a node resumed after its last round serves a neighbour that starts later than it)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        pending, unseen = set(peers), set(not_up_yet) & set(peers)
        while pending and loop.time() < deadline:
            names = sorted(pending)
            statuses = await self._statuses(names, STATUS_POLL_TIMEOUT_S)
            unseen -= {p for p, s in zip(names, statuses) if s is not None} | self.readers_so_far()  # up once: read from us
            pending = {p for p, s in zip(names, statuses) if (s is None and p in unseen) or (s is not None and not s.get("done"))}
            if pending:
                await asyncio.sleep(0.5)
