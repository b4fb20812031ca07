"""Partial participation (`runtime.participation`): which rounds a node takes part in.

Each node draws once per round from its own stream, seeded by its node seed, so the draws are
known to anyone who knows the seed: a node computes its neighbours' schedules before round 1
and, in a round a neighbour sits out, asks it for the version of the last round it took part
in, at once, instead of waiting for a version that round will never have.
"""

from __future__ import annotations

import numpy as np

PARTICIPATION_STREAM = 0x5EA7  # its own stream: sitting out never shifts the strategy's or the trainer's draws


def participation_rng(node_seed: int) -> np.random.Generator:
    return np.random.default_rng([node_seed, PARTICIPATION_STREAM])


def takes_part(rng: np.random.Generator, participation: float) -> bool:
    """This round's draw (none is consumed at full participation)."""
    return participation >= 1 or bool(rng.random() < participation)


def rounds_taking_part(node_seed: int, rounds: int, participation: float) -> frozenset[int]:
    """The rounds (1-based) the node with `node_seed` takes part in: the draws its own loop makes."""
    rng = participation_rng(node_seed)
    return frozenset(r for r in range(1, rounds + 1) if takes_part(rng, participation))


def version_to_ask(rounds_in: frozenset[int] | None, round_: int, accept_stale: bool) -> int | None:
    """What to ask a neighbour for in `round_`: that round where it takes part (or its schedule is
    unknown); where it sits out, the last round before it took part in (None: it has published
    nothing yet, or stale versions are not taken), which it serves at once."""
    if rounds_in is None or round_ in rounds_in:
        return round_
    if not accept_stale:
        return None
    return max((r for r in rounds_in if r < round_), default=None)
