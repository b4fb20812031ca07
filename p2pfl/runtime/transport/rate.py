"""A token bucket per roster member: how many signed requests (reads and pushes) each may make a
second, with a burst. One member sent 650 to 1 270 signed reads a second (1.67 GB of model in
25 s); an honest node reads each neighbour's part once a round."""

from __future__ import annotations

import time
from collections.abc import Callable


class MemberRates:
    def __init__(self, per_s: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        """`per_s` requests a second per member, up to `burst` at once; `per_s` 0: no limit."""
        self.per_s, self.burst, self.clock = per_s, burst, clock
        self._buckets: dict[str, tuple[float, float]] = {}  # member -> (tokens, when counted)

    def take(self, member: str) -> float:
        """0 when `member` may make a request now (one token spent); else the seconds until it may."""
        if self.per_s <= 0:
            return 0.0
        now = self.clock()
        tokens, then = self._buckets.get(member, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.per_s)
        if tokens >= 1.0:
            self._buckets[member] = (tokens - 1.0, now)
            return 0.0
        self._buckets[member] = (tokens, now)
        return (1.0 - tokens) / self.per_s
