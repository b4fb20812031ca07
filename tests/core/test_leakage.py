"""The membership figures against brute force and against a mechanism whose ε is known."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import beta

from p2pfl.core.leakage import clopper_pearson_upper, epsilon_lower_bound, leakage


def _brute_auc(members: np.ndarray, nonmembers: np.ndarray) -> float:
    wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in itertools.product(members, nonmembers))
    return wins / (len(members) * len(nonmembers))


def _brute_advantage(members: np.ndarray, nonmembers: np.ndarray) -> float:
    best = 0.0
    for t in np.concatenate([members, nonmembers, [np.inf]]):
        best = max(best, np.mean(members >= t) - np.mean(nonmembers >= t))
    return best


def test_auc_and_advantage_match_brute_force() -> None:
    rng = np.random.default_rng(3)
    members, nonmembers = rng.normal(0.7, 1, 40).round(1), rng.normal(0, 1, 55).round(1)  # ties on purpose
    out = leakage(members, nonmembers)
    assert out.auc == pytest.approx(_brute_auc(members, nonmembers))
    assert out.advantage == pytest.approx(_brute_advantage(members, nonmembers))
    assert (out.members, out.nonmembers) == (40, 55)


def test_separated_scores_leak_everything_and_same_scores_nothing() -> None:
    rng = np.random.default_rng(0)
    apart = leakage(rng.uniform(2, 3, 500), rng.uniform(0, 1, 500))
    assert (apart.auc, apart.advantage, apart.tpr_at_1pct_fpr) == (1.0, 1.0, 1.0)
    # one threshold between the groups: no error of 500 at each rate, Bonferroni over the thresholds
    assert apart.epsilon_lower_bound > 3.0
    same = leakage(rng.normal(0, 1, 2000), rng.normal(0, 1, 2000))
    assert abs(same.auc - 0.5) < 0.03 and same.advantage < 0.06
    assert same.epsilon_lower_bound < 0.2


def test_bound_of_randomized_response_stays_under_its_epsilon() -> None:
    """Randomized response at ε = 2 is exactly ε-DP: the proven ε must not pass 2, and 10,000 trials
    should prove most of it."""
    eps, n = 2.0, 5000
    p = math.exp(eps) / (1 + math.exp(eps))
    rng = np.random.default_rng(7)
    members = (rng.random(n) < p).astype(float)
    nonmembers = (rng.random(n) < 1 - p).astype(float)
    bound = epsilon_lower_bound(members, nonmembers, delta=0.0)
    assert 1.6 < bound <= eps


def test_clopper_pearson_matches_its_definition() -> None:
    # the upper limit u solves P(Binomial(n, u) <= k) = alpha
    from scipy.stats import binom
    for k, n, alpha in ((0, 100, 0.05), (3, 40, 0.01), (17, 200, 0.001)):
        u = clopper_pearson_upper(k, n, alpha)
        assert binom.cdf(k, n, u) == pytest.approx(alpha, rel=1e-6)
    assert clopper_pearson_upper(5, 5, 0.05) == 1.0
    assert clopper_pearson_upper(0, 10, 0.05) == pytest.approx(1 - 0.05 ** (1 / 10))
    assert beta.ppf(0.95, 1, 10) == pytest.approx(1 - 0.05 ** (1 / 10))


@pytest.mark.parametrize("bad", [[], [float("nan")], [1.0, float("inf")]])
def test_bad_scores_are_named(bad: list[float]) -> None:
    with pytest.raises(ValueError, match="member"):
        leakage(bad, [0.0, 1.0])
    with pytest.raises(ValueError, match="delta"):
        epsilon_lower_bound([1.0], [0.0], delta=1.5)
