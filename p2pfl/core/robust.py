"""Aggregates that one bad model cannot drag far: coordinate-wise median and trimmed mean.

A weighted mean moves by w·x when one member is x away; a single peer sending 10³ times its
update moves it by as much as it likes. The coordinate-wise median and the β-trimmed mean
(Yin et al., ICML 2018) take each coordinate over the members separately and ignore the
extreme ones, so fewer than half (median) or fewer than ⌊β·n⌋ per side (trimmed mean) bad
members cannot move a coordinate outside the range of the good ones. Both ignore sample
counts: a count is a claim, and weighting by it would hand the attacker its weight back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

State = Mapping[str, torch.Tensor]
ROBUST_RULES = ("median", "trimmed_mean")


def trimmed_count(n: int, trim: float) -> int:
    """How many members a `trim`-trimmed mean drops at each end of each coordinate: ⌊trim·n⌋,
    at most (n − 1) // 2 so that one member always remains."""
    if not 0 <= trim < 0.5:
        raise ValueError(f"trim must be in [0, 0.5), got {trim}")
    return min(math.floor(trim * n), (n - 1) // 2)


def robust_aggregate(states: Sequence[State], rule: str, trim: float = 0.1) -> dict[str, torch.Tensor]:
    """Each floating tensor aggregated coordinate-wise over `states` by `rule` ("median": the
    mean of the two middle values for an even count, as numpy's; "trimmed_mean": the mean
    without the `trimmed_count` lowest and highest). Integer tensors keep the first state's value."""
    if rule not in ROBUST_RULES:
        raise ValueError(f"unknown robust rule {rule!r}; choose one of {ROBUST_RULES}")
    if not states:
        raise ValueError("robust_aggregate needs at least one state")
    keys = set(states[0])
    for s in states[1:]:
        if set(s) != keys:
            raise ValueError(f"state keys differ from the first state's: {sorted(set(s) ^ keys)[:3]}")
    n = len(states)
    cut = trimmed_count(n, trim) if rule == "trimmed_mean" else 0
    out: dict[str, torch.Tensor] = {}
    for k, first in states[0].items():
        if not first.is_floating_point():
            out[k] = first.detach().clone()
            continue
        stacked = torch.stack([s[k].detach().to(first.device, torch.float64) for s in states])
        ordered = stacked.sort(dim=0).values
        if rule == "median":
            middle = ordered[(n - 1) // 2: n // 2 + 1]  # one value for odd n, the two middle for even n
        else:
            middle = ordered[cut: n - cut]
        out[k] = middle.mean(dim=0).to(first.dtype)
    return out
