"""The run's membership timeline: who was live in each round, and who joined, left, crashed and
came back then (from each node's records and its churn events). Built from what the nodes
recorded, so a run reads the same whichever placement ran it; same seed and schedule, same
timeline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

EVENTS = ("joined", "left", "crashed", "restarted", "revoked", "stepped_out", "stepped_back")  # the last two: churn.flap


def membership_timeline(nodes: Sequence[Mapping[str, Any]], rounds: int) -> list[dict[str, Any]]:
    """One entry per round: `live` (ran the round: trained or sat it out), `sat_out`, and each
    event's nodes (`joined`, `left`, `crashed`, `restarted`, `revoked`, and a flapping member's
    `stepped_out` and `stepped_back`), ids sorted."""
    timeline = [{"round": r, "live": [], "sat_out": [], **{e: [] for e in EVENTS}} for r in range(1, rounds + 1)]
    for node in sorted(nodes, key=lambda n: str(n.get("id"))):
        for record in node.get("rounds") or []:
            r = record.get("round")
            if isinstance(r, int) and 1 <= r <= rounds:
                timeline[r - 1]["live"].append(node["id"])
                if record.get("participated") is False:
                    timeline[r - 1]["sat_out"].append(node["id"])
        for event in node.get("membership") or []:
            r, kind = event.get("round"), event.get("event")
            if isinstance(r, int) and 1 <= r <= rounds and kind in EVENTS:
                timeline[r - 1][kind].append(node["id"])
    return timeline


def has_churn(nodes: Sequence[Mapping[str, Any]]) -> bool:
    return any(node.get("membership") for node in nodes)
