"""Shapley values of a cooperative game over hashable players.

A game is a list of players and a utility `v(frozenset) -> float`. Two estimators:

* `exact_shapley`: eq. 3 of pFedSV, a weighted sum over all subsets; 2^n - 1 utility
  evaluations, so only for small coalitions.
* `monte_carlo_shapley`: Algorithm 2 of pFedSV, the mean marginal contribution over R random
  permutations (default R = 3n). Optional truncation (truncated Monte Carlo, Ghorbani & Zou
  2019): once the prefix is within `tol` of v(all players), the remaining marginals of that
  permutation are taken as 0 and their utilities are never evaluated.

Both go through `CachedUtility`, so a subset is evaluated at most once however many
permutations share it, and `v(empty set)` is a constant (0 by the paper's convention, or
whatever the caller passes, e.g. chance accuracy 1/C) rather than a call.

Efficiency: each permutation's marginals telescope to v(all) - v(empty), so both estimators
distribute exactly v(all) - v(empty) (up to float rounding); with truncation the error of the
sum is below `tol`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

Utility = Callable[[frozenset], float]

DEFAULT_EXACT_MAX_PLAYERS = 8


class CachedUtility:
    """Memoises `v` per subset; `evaluations` counts real calls, `hits` repeated lookups."""

    def __init__(self, utility: Utility, empty_value: float = 0.0) -> None:
        self._utility = utility
        self._cache: dict[frozenset, float] = {frozenset(): float(empty_value)}
        self.evaluations = 0
        self.hits = 0

    @property
    def empty_value(self) -> float:
        return self._cache[frozenset()]

    def __call__(self, coalition: frozenset) -> float:
        cached = self._cache.get(coalition)
        if cached is not None:
            self.hits += 1
            return cached
        value = float(self._utility(coalition))
        self._cache[coalition] = value
        self.evaluations += 1
        return value

    def __contains__(self, coalition: frozenset) -> bool:
        return coalition in self._cache


@dataclass
class ShapleyResult:
    values: dict[Hashable, float]
    method: str  # "exact" or "monte_carlo"
    evaluations: int  # distinct subsets whose utility was computed (v(empty) excluded)
    hits: int  # lookups answered from the cache
    permutations: int = 0
    # Marginal contributions set to 0 by truncation instead of being evaluated.
    truncated: int = 0
    # v(all players) and v(empty): their difference is what the values distribute.
    grand_value: float = 0.0
    empty_value: float = 0.0
    extras: dict[str, float] = field(default_factory=dict)

    def as_list(self, players: Sequence[Hashable]) -> list[float]:
        return [self.values[p] for p in players]


def _check_players(players: Sequence[Hashable]) -> list[Hashable]:
    players = list(players)
    if len(set(players)) != len(players):
        raise ValueError("players must be distinct")
    return players


def exact_shapley(
    players: Sequence[Hashable],
    utility: Utility | CachedUtility,
    *,
    empty_value: float = 0.0,
) -> ShapleyResult:
    """phi_i = sum over S in N\\{i} of |S|!(n-|S|-1)!/n! (v(S u {i}) - v(S))  (eq. 3)."""
    players = _check_players(players)
    v = utility if isinstance(utility, CachedUtility) else CachedUtility(utility, empty_value)
    n = len(players)
    if n == 0:
        return ShapleyResult({}, "exact", v.evaluations, v.hits, empty_value=v.empty_value, grand_value=v.empty_value)
    # Every subset's utility, indexed by bitmask, so each marginal is two array reads.
    subsets = [frozenset(p for b, p in enumerate(players) if mask >> b & 1) for mask in range(1 << n)]
    table = np.array([v(s) for s in subsets], dtype=np.float64)
    # Subsets without player i have at most n - 1 members; index n is a pad for the full set.
    weight = [math.factorial(s) * math.factorial(n - s - 1) / math.factorial(n) for s in range(n)] + [0.0]
    sizes = np.array([bin(mask).count("1") for mask in range(1 << n)])
    size_weight = np.array(weight)[sizes]
    values: dict[Hashable, float] = {}
    masks = np.arange(1 << n)
    for b, player in enumerate(players):
        without = masks[(masks >> b & 1) == 0]
        w = size_weight[without]
        values[player] = float(np.sum(w * (table[without | (1 << b)] - table[without])))
    return ShapleyResult(
        values, "exact", v.evaluations, v.hits,
        grand_value=float(table[-1]), empty_value=v.empty_value,
    )


def monte_carlo_shapley(
    players: Sequence[Hashable],
    utility: Utility | CachedUtility,
    *,
    rng: np.random.Generator,
    permutations: int | None = None,
    empty_value: float = 0.0,
    truncation: float | None = None,
) -> ShapleyResult:
    """Mean marginal contribution over `permutations` random orders (Algorithm 2; default 3n)."""
    players = _check_players(players)
    v = utility if isinstance(utility, CachedUtility) else CachedUtility(utility, empty_value)
    n = len(players)
    r = 3 * n if permutations is None else int(permutations)
    if r < 1 and n > 0:
        raise ValueError(f"permutations must be >= 1, got {r}")
    totals = dict.fromkeys(players, 0.0)
    if n == 0:
        return ShapleyResult({}, "monte_carlo", v.evaluations, v.hits, empty_value=v.empty_value, grand_value=v.empty_value)
    grand = v(frozenset(players))
    skipped = 0
    for _ in range(r):
        prefix: frozenset = frozenset()
        previous = v.empty_value
        order = rng.permutation(n)
        for position, index in enumerate(order):
            if truncation is not None and abs(grand - previous) < truncation:
                # The rest of this permutation adds (almost) nothing: count it as 0.
                skipped += n - position
                break
            player = players[index]
            prefix = prefix | {player}
            current = v(prefix)
            totals[player] += current - previous
            previous = current
    values = {p: totals[p] / r for p in players}
    return ShapleyResult(
        values, "monte_carlo", v.evaluations, v.hits,
        permutations=r, truncated=skipped, grand_value=grand, empty_value=v.empty_value,
    )


def shapley_values(
    players: Sequence[Hashable],
    utility: Utility,
    *,
    rng: np.random.Generator | None = None,
    permutations: int | None = None,
    exact_max_players: int = DEFAULT_EXACT_MAX_PLAYERS,
    empty_value: float = 0.0,
    truncation: float | None = None,
) -> ShapleyResult:
    """Exact values when `len(players) <= exact_max_players`, else Monte Carlo.

    At n players exact costs 2^n - 1 evaluations and R = 3n permutations cost at most 3n^2
    (fewer with the cache): the two meet around n = 8 or 9. `permutations` and `truncation`
    only apply to Monte Carlo; pass `exact_max_players=0` to force it.
    """
    cached = CachedUtility(utility, empty_value)
    if len(players) <= exact_max_players:
        return exact_shapley(players, cached)
    if rng is None:
        raise ValueError("Monte Carlo Shapley values need an rng")
    return monte_carlo_shapley(players, cached, rng=rng, permutations=permutations, truncation=truncation)
