"""Bytes on the wire per round, split into parameter and metadata bytes and by part.

Counts whole message frames (header, signature, tensor table and data); HTTP framing is
not counted, so the numbers are the protocol's own and comparable across transports.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

CONTROL = "control"


@dataclass
class Tally:
    total: int = 0
    params: int = 0
    messages: int = 0

    def add(self, total: int, params: int) -> None:
        self.total += total
        self.params += params
        self.messages += 1


@dataclass
class RoundBytes:
    sent: dict[str, Tally] = field(default_factory=lambda: defaultdict(Tally))
    received: dict[str, Tally] = field(default_factory=lambda: defaultdict(Tally))

    def summary(self) -> dict[str, object]:
        def total(side: dict[str, Tally], attr: str) -> int:
            return sum(getattr(t, attr) for t in side.values())

        return {
            "bytes_sent": total(self.sent, "total"),
            "bytes_received": total(self.received, "total"),
            "param_bytes_sent": total(self.sent, "params"),
            "param_bytes_received": total(self.received, "params"),
            "messages_sent": total(self.sent, "messages"),
            "messages_received": total(self.received, "messages"),
            "bytes_by_part": {
                "sent": {p: t.total for p, t in sorted(self.sent.items())},
                "received": {p: t.total for p, t in sorted(self.received.items())},
            },
        }


class ByteCounter:
    """Attributes traffic to the round the node is in when the bytes move."""

    def __init__(self) -> None:
        self.round = 0
        self.rounds: dict[int, RoundBytes] = defaultdict(RoundBytes)
        self.earlier: dict[str, int] = {}  # totals of the run before a resume

    def begin_round(self, round_: int) -> None:
        self.round = round_

    def sent(self, part: str, total: int, params: int) -> None:
        self.rounds[self.round].sent[part or CONTROL].add(total, params)

    def received(self, part: str, total: int, params: int) -> None:
        self.rounds[self.round].received[part or CONTROL].add(total, params)

    def round_summary(self, round_: int) -> dict[str, object]:
        return self.rounds[round_].summary()

    def totals(self) -> dict[str, int]:
        out = {key: int(self.earlier.get(key, 0))
               for key in ("bytes_sent", "bytes_received", "param_bytes_sent", "param_bytes_received")}
        for rb in self.rounds.values():
            s = rb.summary()
            for key in out:
                out[key] += int(s[key])  # type: ignore[call-overload]
        return out
