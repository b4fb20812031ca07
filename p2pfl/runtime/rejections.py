"""A bounded record of rejected requests, and rate-limited log lines about them.

Everything in a rejection may be chosen by an attacker (the sender name of an unverified
frame, a 64 KiB reason string), so the record keeps counts per (sender, status, reason
kind), the last `keep` rejections with truncated text, and marks senders it could not
verify as such. Log lines are limited per reason kind; the rest are counted.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from typing import Any

from p2pfl.wire.errors import quote

UNVERIFIED = "?"
# A member the federation took out goes on knocking until it hears: its refusals are logged once
# per sender (and counted), not once per knock.
ONCE_PER_SENDER = frozenset({"certificate_revoked", "certificate_expired"})


def sender_label(name: str | None, verified: bool) -> str:
    """A verified roster id as it is; anything else marked, truncated and quoted."""
    if name is None or name == "":
        return UNVERIFIED
    return name if verified else f"unverified:{quote(name, 40)}"


class RejectionLog:
    def __init__(self, log: logging.Logger, *, keep: int = 100, reason_chars: int = 300,
                 lines_per_window: int = 20, window_s: float = 10.0) -> None:
        self.log = log
        self.recent: deque[tuple[str, int, str]] = deque(maxlen=keep)
        self.counts: Counter[tuple[str, int, str]] = Counter()
        self.reason_chars = reason_chars
        self.lines_per_window = lines_per_window
        self.window_s = window_s
        self._window_start = time.monotonic()
        self._lines: Counter[str] = Counter()
        self.suppressed = 0

    def add(self, sender: str, status: int, kind: str, reason: str) -> None:
        reason = reason if len(reason) <= self.reason_chars else reason[: self.reason_chars - 3] + "..."
        self.recent.append((sender, status, reason))
        self.counts[(sender, status, kind)] += 1
        now = time.monotonic()
        if now - self._window_start > self.window_s:
            if self.suppressed:
                self.log.warning("%d more rejections were not logged in the last %.0f s", self.suppressed, self.window_s)
            self._window_start, self._lines, self.suppressed = now, Counter(), 0
        self._lines[kind] += 1
        if kind in ONCE_PER_SENDER and self.counts[(sender, status, kind)] > 1:
            self.suppressed += 1
        elif self._lines[kind] <= self.lines_per_window:
            self.log.warning("rejected message from %s: %d %s", sender, status, reason)
        else:
            self.suppressed += 1

    def __len__(self) -> int:
        return sum(self.counts.values())

    def __iter__(self):  # the recent ones, oldest first
        return iter(self.recent)

    def summary(self) -> dict[str, Any]:
        return {
            "total": len(self),
            "counts": [{"sender": s, "status": c, "reason": k, "count": n} for (s, c, k), n in sorted(self.counts.items())],
            "recent": [{"sender": s, "status": c, "reason": r} for s, c, r in self.recent],
        }
