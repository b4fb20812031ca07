from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from p2pfl.core.shapley import CachedUtility, exact_shapley, monte_carlo_shapley, shapley_values


def additive(parts: dict[str, float]):
    return lambda s: sum(parts[p] for p in s)


def squared(parts: dict[str, float]):
    """v(S) = (sum a_i)^2: not additive, so Monte Carlo has real variance."""
    return lambda s: sum(parts[p] for p in s) ** 2


def brute_force(players, v, empty=0.0):
    """Definition (eq. 2): mean marginal over all n! orders."""
    totals = dict.fromkeys(players, 0.0)
    orders = list(itertools.permutations(players))
    for order in orders:
        prefix, prev = frozenset(), empty
        for p in order:
            prefix = prefix | {p}
            cur = v(prefix) if prefix else empty
            totals[p] += cur - prev
            prev = cur
    return {p: t / len(orders) for p, t in totals.items()}


def test_additive_game_gives_the_additive_parts():
    parts = {"a": 0.1, "b": -0.3, "c": 0.5, "d": 0.0, "e": 0.25}
    ex = exact_shapley(list(parts), additive(parts))
    mc = monte_carlo_shapley(list(parts), additive(parts), rng=np.random.default_rng(0), permutations=3)
    for p, a in parts.items():
        assert ex.values[p] == pytest.approx(a, abs=1e-12)
        # Every marginal of an additive game is a_i, so even 3 permutations are exact.
        assert mc.values[p] == pytest.approx(a, abs=1e-12)


def test_exact_matches_the_permutation_definition_and_the_glove_game():
    parts = {i: w for i, w in enumerate([0.3, 0.1, 0.7, 0.2])}
    v = squared(parts)
    ex = exact_shapley(list(parts), v)
    ref = brute_force(list(parts), v)
    for p in parts:
        assert ex.values[p] == pytest.approx(ref[p], abs=1e-12)
    # Glove game: two left gloves, one right; known values 1/6, 1/6, 2/3.
    glove = lambda s: float(min(len(s & {"L1", "L2"}), len(s & {"R"})))  # noqa: E731
    g = exact_shapley(["L1", "L2", "R"], glove)
    assert g.values == pytest.approx({"L1": 1 / 6, "L2": 1 / 6, "R": 2 / 3})


def test_null_player_gets_zero_and_symmetric_players_equal_values():
    parts = {"a": 0.4, "b": 0.4, "c": 0.9}

    def v(s):  # "z" is a null player; a and b are symmetric
        return squared(parts)(s - {"z"})

    players = ["a", "b", "c", "z"]
    ex = exact_shapley(players, v)
    assert ex.values["z"] == 0.0
    assert ex.values["a"] == pytest.approx(ex.values["b"], abs=1e-12)
    mc = monte_carlo_shapley(players, v, rng=np.random.default_rng(1), permutations=400)
    assert mc.values["z"] == 0.0  # every marginal of a null player is exactly 0
    assert mc.values["a"] == pytest.approx(mc.values["b"], abs=0.05)


def test_monte_carlo_converges_to_exact_and_error_shrinks_with_r():
    rng = np.random.default_rng(42)
    parts = {i: float(w) for i, w in enumerate(rng.uniform(-0.5, 1.0, size=7))}
    v = squared(parts)
    exact = np.array(exact_shapley(list(parts), v).as_list(list(parts)))
    errors = {}
    for r in (7, 70, 700):
        errs = []
        for seed in range(8):
            mc = monte_carlo_shapley(list(parts), v, rng=np.random.default_rng(seed), permutations=r)
            errs.append(np.abs(np.array(mc.as_list(list(parts))) - exact).mean())
        errors[r] = float(np.mean(errs))
    assert errors[7] > errors[70] > errors[700]
    # Standard error falls as 1/sqrt(R): 100x the permutations, about 10x smaller error.
    assert errors[700] < errors[7] / 4
    assert errors[700] < 0.05 * np.abs(exact).mean()


@pytest.mark.parametrize("empty", [0.0, 0.1])
def test_efficiency_is_exact_for_both_estimators(empty):
    rng = np.random.default_rng(3)
    parts = {i: float(w) for i, w in enumerate(rng.uniform(0, 1, size=6))}
    v = lambda s: 1.0 - np.prod([1 - parts[p] for p in s])  # noqa: E731  (saturating)
    grand = v(frozenset(parts))
    ex = exact_shapley(list(parts), v, empty_value=empty)
    assert sum(ex.values.values()) == pytest.approx(grand - empty, abs=1e-12)
    for r in (1, 2, 5, 18):
        mc = monte_carlo_shapley(list(parts), v, rng=np.random.default_rng(r), permutations=r, empty_value=empty)
        # Each permutation telescopes to v(N) - v(empty), so the mean does too.
        assert sum(mc.values.values()) == pytest.approx(grand - empty, abs=1e-12)
        assert mc.grand_value == grand and mc.empty_value == empty


def test_cache_evaluates_each_subset_once_and_never_the_empty_set():
    calls: Counter = Counter()
    parts = {i: float(i + 1) for i in range(5)}

    def v(s):
        calls[s] += 1
        assert s, "v(empty) must come from empty_value"
        return squared(parts)(s)

    ex = exact_shapley(list(parts), v)
    assert ex.evaluations == 2**5 - 1 and max(calls.values()) == 1

    calls.clear()
    r = 40
    mc = monte_carlo_shapley(list(parts), v, rng=np.random.default_rng(0), permutations=r)
    assert max(calls.values()) == 1
    assert mc.evaluations == len(calls) <= 2**5 - 1
    # One lookup for v(N) up front, then n per permutation; the rest were cache hits.
    assert mc.evaluations + mc.hits == 1 + r * 5
    assert mc.hits > 0


def test_shared_cache_across_calls():
    parts = {i: float(i) for i in range(4)}
    cached = CachedUtility(squared(parts))
    exact_shapley(list(parts), cached)
    before = cached.evaluations
    monte_carlo_shapley(list(parts), cached, rng=np.random.default_rng(0))
    assert cached.evaluations == before  # every subset was already known


def test_truncation_skips_evaluations_and_still_sums_within_tolerance():
    n = 10
    parts = {i: 0.5 for i in range(n)}
    # Saturating utility: after a few members, more add almost nothing.
    v = lambda s: 1.0 - np.prod([1 - parts[p] for p in s])  # noqa: E731
    tol = 0.02
    full = monte_carlo_shapley(list(parts), v, rng=np.random.default_rng(0), permutations=30)
    trunc = monte_carlo_shapley(list(parts), v, rng=np.random.default_rng(0), permutations=30, truncation=tol)
    assert trunc.truncated > 0
    assert trunc.evaluations < full.evaluations
    grand = v(frozenset(parts))
    assert abs(sum(trunc.values.values()) - grand) < tol
    # Same seed, same permutations: the skipped marginals of one permutation sum (in absolute
    # value, as the utility is monotone) to less than tol, so values move by less than tol in all.
    diff = np.abs(np.array(trunc.as_list(list(parts))) - np.array(full.as_list(list(parts))))
    assert diff.sum() < tol


def test_dispatch_uses_exact_for_small_games_and_monte_carlo_otherwise():
    parts = {i: float(i) for i in range(5)}
    small = shapley_values(list(parts), squared(parts), exact_max_players=5)
    assert small.method == "exact"
    big = shapley_values(list(parts), squared(parts), exact_max_players=4, rng=np.random.default_rng(0))
    assert big.method == "monte_carlo" and big.permutations == 15  # default R = 3|S|
    with pytest.raises(ValueError):
        shapley_values(list(parts), squared(parts), exact_max_players=0)


def test_seeded_monte_carlo_is_reproducible_and_empty_games_are_fine():
    parts = {i: float(i) for i in range(6)}
    a = monte_carlo_shapley(list(parts), squared(parts), rng=np.random.default_rng(7))
    b = monte_carlo_shapley(list(parts), squared(parts), rng=np.random.default_rng(7))
    assert a.values == b.values
    assert exact_shapley([], squared(parts)).values == {}
    assert monte_carlo_shapley([], squared(parts), rng=np.random.default_rng(0)).values == {}
    with pytest.raises(ValueError):
        exact_shapley(["a", "a"], squared({"a": 1.0}))
