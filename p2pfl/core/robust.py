"""Aggregates that one bad model cannot drag far: coordinate-wise median and trimmed mean,
Krum, Multi-Krum and Bulyan.

A weighted mean moves by w·x when one member is x away; a single peer sending 10³ times its
update moves it by as much as it likes. The coordinate-wise median and the β-trimmed mean
(Yin et al., ICML 2018) take each coordinate over the members separately and ignore the
extreme ones, so fewer than half (median) or fewer than ⌊β·n⌋ per side (trimmed mean) bad
members cannot move a coordinate outside the range of the good ones. Both ignore sample
counts: a count is a claim, and weighting by it would hand the attacker its weight back.

Krum (Blanchard et al., NeurIPS 2017) scores each of n models by the sum of its squared
distances to its n − f − 2 nearest others, f being the number of bad models to tolerate
(n ≥ 2f + 3), and takes the model of lowest score; Multi-Krum averages the m lowest. Bulyan
(El Mhamdi et al., ICML 2018; n ≥ 4f + 3) picks θ = n − 2f models by Krum one at a time, each
from those not yet picked, then takes each coordinate as the mean of the β = θ − 2f picked
values closest to their median. All three are unweighted, like the coordinate-wise rules.

Conventions the papers leave open, taken as the references compute them (Flower's
`flwr.server.strategy.aggregate`; tests/core/test_flower_conformance.py feeds both the same inputs):

* a median of an even count is the mean of the two middle values (numpy's, Flower's
  `aggregate_median`), in the coordinate-wise rule and in Bulyan's step alike;
* Krum scores over at least one neighbour, max(1, n − f − 2) (Flower's `aggregate_krum`): Bulyan's
  last picks, with 3 or fewer models left at f = 1, are still Krum's, not the lowest index;
* squared distances are sums of squared differences in float64 (`squared_distances`), never
  ‖a‖² + ‖b‖² − 2a·b (`torch.cdist`'s matrix-product path above 25 rows), whose rounding picks
  another model once the models' norms are ~10⁷ times their spread.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

State = Mapping[str, torch.Tensor]
COORDINATE_RULES = ("median", "trimmed_mean")
SELECTION_RULES = ("krum", "multi_krum", "bulyan")
ROBUST_RULES = COORDINATE_RULES + SELECTION_RULES


def trimmed_count(n: int, trim: float) -> int:
    """How many members a `trim`-trimmed mean drops at each end of each coordinate: ⌊trim·n⌋,
    at most (n − 1) // 2 so that one member always remains."""
    if not 0 <= trim < 0.5:
        raise ValueError(f"trim must be in [0, 0.5), got {trim}")
    return min(math.floor(trim * n), (n - 1) // 2)


def models_needed(rule: str, byzantine: int) -> int:
    """The fewest models `rule` is defined on while tolerating `byzantine` bad ones."""
    return {"krum": 2 * byzantine + 3, "multi_krum": 2 * byzantine + 3, "bulyan": 4 * byzantine + 3}.get(rule, 1)


def _flat(states: Sequence[State]) -> torch.Tensor:
    """(n, d) float64: each state's floating tensors, concatenated in the first state's key order."""
    keys = [k for k, v in states[0].items() if v.is_floating_point()]
    return torch.stack([torch.cat([s[k].detach().reshape(-1).double().cpu() for k in keys]) for s in states])


def squared_distances(flat: torch.Tensor) -> torch.Tensor:
    """(n, n): each pair of rows' squared distance, summed from their difference (exact to the
    rounding of each term, whatever the rows' norms)."""
    return torch.stack([(flat - row).pow(2).sum(dim=1) for row in flat])


def coordinate_median(stacked: torch.Tensor) -> torch.Tensor:
    """The median over dim 0: the middle value, or the mean of the two middle values of an even count."""
    n = stacked.shape[0]
    return stacked.sort(dim=0).values[(n - 1) // 2: n // 2 + 1].mean(dim=0)


def krum_scores(flat: torch.Tensor, byzantine: int) -> torch.Tensor:
    """Each row's Krum score: the sum of its squared distances to its max(1, n − f − 2) nearest other rows."""
    n = flat.shape[0]
    squared = squared_distances(flat)
    squared.fill_diagonal_(math.inf)
    nearest = min(max(1, n - byzantine - 2), n - 1)
    return squared.sort(dim=1).values[:, :nearest].sum(dim=1)


def krum_select(flat: torch.Tensor, byzantine: int, m: int = 1) -> list[int]:
    """The rows Multi-Krum averages: the `m` of lowest score (ties to the lower index)."""
    scores = krum_scores(flat, byzantine)
    return sorted(sorted(range(flat.shape[0]), key=lambda i: (float(scores[i]), i))[:m])


def bulyan_select(flat: torch.Tensor, byzantine: int) -> list[int]:
    """Bulyan's θ = n − 2f rows, each the Krum pick of the rows not yet picked."""
    left, picked = list(range(flat.shape[0])), []
    for _ in range(flat.shape[0] - 2 * byzantine):
        [chosen] = krum_select(flat[left], byzantine)
        picked.append(left.pop(chosen))
    return sorted(picked)


def _check_selection(n: int, rule: str, byzantine: int, keep: int) -> None:
    if byzantine < 0:
        raise ValueError(f"byzantine must be >= 0, got {byzantine}")
    if n < models_needed(rule, byzantine):
        raise ValueError(f"{rule} with byzantine = {byzantine} needs at least {models_needed(rule, byzantine)} models, "
                         f"got {n}")
    if rule == "multi_krum" and not 1 <= keep <= n - byzantine:
        raise ValueError(f"multi_krum keeps 1 to n - byzantine = {n - byzantine} models, got {keep}")


def selection_aggregate(states: Sequence[State], rule: str, byzantine: int = 1, keep: int = 0
                        ) -> tuple[dict[str, torch.Tensor], list[int]]:
    """`rule` ("krum", "multi_krum" with `keep` models, 0: n − f; "bulyan") over `states`, and the
    indices of the states it picked. Integer tensors keep the first state's value."""
    n = len(states)
    keep = keep or n - byzantine
    _check_selection(n, rule, byzantine, keep)
    flat = _flat(states)
    if rule == "krum":
        picked = krum_select(flat, byzantine)
    elif rule == "multi_krum":
        picked = krum_select(flat, byzantine, keep)
    else:
        picked = bulyan_select(flat, byzantine)
    out: dict[str, torch.Tensor] = {}
    beta = len(picked) - 2 * byzantine
    for k, first in states[0].items():
        if not first.is_floating_point():
            out[k] = first.detach().clone()
            continue
        stacked = torch.stack([states[i][k].detach().to(first.device, torch.float64) for i in picked])
        if rule == "bulyan":  # per coordinate: the β values closest to the median of the picked ones
            median = coordinate_median(stacked)
            closest = (stacked - median).abs().argsort(dim=0, stable=True)[:beta]
            stacked = stacked.gather(0, closest)
        out[k] = stacked.mean(dim=0).to(first.dtype)
    return out, picked


def robust_aggregate(states: Sequence[State], rule: str, trim: float = 0.1) -> dict[str, torch.Tensor]:
    """Each floating tensor aggregated coordinate-wise over `states` by `rule` ("median": the
    mean of the two middle values for an even count, as numpy's; "trimmed_mean": the mean
    without the `trimmed_count` lowest and highest). Integer tensors keep the first state's value."""
    if rule not in COORDINATE_RULES:
        raise ValueError(f"unknown coordinate-wise rule {rule!r}; choose one of {COORDINATE_RULES}")
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
        if rule == "median":
            out[k] = coordinate_median(stacked).to(first.dtype)
        else:
            out[k] = stacked.sort(dim=0).values[cut: n - cut].mean(dim=0).to(first.dtype)
    return out
