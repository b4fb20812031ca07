"""The versions a node serves: its recent round versions and every setup step, with waiting
readers. Pure asyncio, no carrier: HTTP and loopback serve from the same stores."""

from __future__ import annotations

import asyncio
import collections
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from p2pfl.runtime.deadline import wait_at_most
from p2pfl.wire import EncodedBody

#: Parts published before round 1 (Strategy.setup's exchange) are named "setup.<name>".
SETUP_PREFIX = "setup."


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
# Within that budget, a version older than every version its readers have asked for is dropped:
# a reader asks for rounds in order, so no read can be answered with it again. A thousand
# nodes in two processes held every round's model each (4 rounds: 1.7 MiB a node) before.
# A read answered in full counts as an ask of the next round: the reader asks for the round it
# got no more (at 10,000 nodes, each node's round-1 version waited for its slowest neighbour to
# ask for round 2, and round 2 passed 21 GB where round 1 had stayed under it).
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
        # Who reads this store (`expect_readers`; None: unknown, nothing is dropped early) and the
        # highest version each asked for; readers that said goodbye are forgotten.
        self.readers: frozenset[str] | None = None
        self._asked: dict[str, int] = {}
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

    def note_read(self, reader: str, min_version: int) -> None:
        """`reader` asked for `min_version`: versions older than every reader's last ask go.
        A reader that has not asked yet holds every version back (`held_bytes` still bounds them)."""
        if min_version <= self._asked.get(reader, -1):
            return
        self._asked[reader] = min_version
        if self.readers is None or len(self.recent) < 2 or self.recent[0].version >= min_version:
            return
        self._drop_read()

    def note_answered(self, reader: str, min_version: int, part: str) -> None:
        """`reader`'s read of `part` at `min_version` was answered in full (the carrier sent all of
        it): where that version holds no other part (which the reader may read next: FedRep's head,
        a sparse part's whole copy), its next read asks for a later round."""
        answered = self.held(min_version)
        if answered is not None and {*answered.bodies, *answered.addressed} == {part}:
            self.note_read(reader, min_version + 1)

    def _drop_read(self) -> None:
        if self.readers is None or not self.readers <= self._asked.keys():
            return
        floor = min(self._asked.values())
        while len(self.recent) > 1 and self.recent[0].version < floor:
            self._recent_bytes -= published_bytes(self.recent.popleft())

    @property
    def readers_seen(self) -> frozenset[str]:
        """Every peer that read this store's versions, expected or not (a neighbour's stand-in)."""
        return frozenset(self._asked) | (self.readers or frozenset())

    def forget_reader(self, reader: str) -> None:
        self._asked.pop(reader, None)
        if self.readers is not None:
            self.readers = self.readers - {reader}

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
                await wait_at_most(self._changed.wait_for(ready), timeout)
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
                await wait_at_most(
                    self._changed.wait_for(lambda: self.withdrawn or self.earliest(min_version, part) is not None),
                    timeout)
            except asyncio.TimeoutError:
                pass
            return self.earliest(min_version, part)
