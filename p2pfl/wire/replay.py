"""Per-sender anti-replay window, as in IPsec (RFC 4303 §3.4.3).

Senders number their messages with a monotonically increasing `seq`. The guard keeps
the highest seq seen per sender plus a bitmap of the `window` seqs below it, so
concurrent requests may arrive out of order while every seq is accepted at most once
and memory stays O(window) bits per sender regardless of traffic.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from p2pfl.wire.errors import ReplayedMessage, StaleMessage, quote


class _Window:
    __slots__ = ("highest", "bits")

    def __init__(self) -> None:
        self.highest = -1
        # Bit i set <=> seq (highest - i) was recorded. A Python int is a cheap bitset.
        self.bits = 0


class ReplayGuard:
    def __init__(self, window: int = 4096, max_skew_s: float = 300.0, clock: Callable[[], float] = time.time) -> None:
        if window < 1:
            raise ValueError(f"replay window must be >= 1, got {window}")
        if not max_skew_s > 0:
            raise ValueError(f"max_skew_s must be > 0, got {max_skew_s}")
        self.window = window
        self.max_skew_s = max_skew_s
        self._clock = clock
        self._mask = (1 << window) - 1
        self._senders: dict[str, _Window] = {}
        # open_message may run in worker threads (hashing large bodies off the event loop);
        # record() re-checks under this lock so two copies of one frame cannot both pass.
        self._lock = threading.Lock()

    def _check_seq(self, sender: str, seq: int) -> None:
        w = self._senders.get(sender)
        if w is None or seq > w.highest:
            return
        age = w.highest - seq
        if age >= self.window:
            raise ReplayedMessage(
                f"seq {seq} from {quote(sender)} is older than the replay window "
                f"(highest seen {w.highest}, window {self.window})"
            )
        if (w.bits >> age) & 1:
            raise ReplayedMessage(f"seq {seq} from {quote(sender)} was already accepted")

    def check(self, sender: str, seq: int, timestamp: float) -> None:
        """Raise if (sender, seq) was seen or the timestamp is off; records nothing."""
        with self._lock:
            self._check_seq(sender, seq)
        now = self._clock()
        if not math.isfinite(timestamp) or abs(timestamp - now) > self.max_skew_s:
            raise StaleMessage(
                f"timestamp {timestamp:.3f} from {quote(sender)} is {timestamp - now:+.1f}s from the "
                f"receiver clock, allowed +-{self.max_skew_s:g}s"
            )

    def record(self, sender: str, seq: int) -> None:
        """Mark seq as consumed. Raises ReplayedMessage if it was consumed meanwhile."""
        with self._lock:
            self._check_seq(sender, seq)
            w = self._senders.get(sender)
            if w is None:
                w = self._senders[sender] = _Window()
            if seq > w.highest:
                shift = seq - w.highest
                w.bits = ((w.bits << shift) | 1) & self._mask if shift < self.window else 1
                w.highest = seq
            else:
                w.bits |= 1 << (w.highest - seq)

    def highest(self, sender: str) -> int | None:
        """Highest seq recorded for sender (None if none): lets a restarted sender resume above it."""
        with self._lock:
            w = self._senders.get(sender)
            return None if w is None else w.highest

    def snapshot(self) -> dict[str, int]:
        """Highest seq per sender, to persist: after a restart everything at or below it counts as seen."""
        with self._lock:
            return {sender: w.highest for sender, w in self._senders.items()}

    def restore(self, highest: dict[str, int]) -> None:
        with self._lock:
            for sender, seq in highest.items():
                w = self._senders.setdefault(sender, _Window())
                if seq > w.highest:
                    w.highest, w.bits = seq, self._mask  # the whole window below it: seen
