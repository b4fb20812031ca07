from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from p2pfl.core.relevance import (
    ema_update,
    epsilon_greedy,
    fedfomo_weights,
    next_k,
    pfedsv_weights,
    rank_peers,
    stalest,
    top_k,
)
from p2pfl.core.scoring import (
    label_distribution,
    label_overlap,
    overlap_matrix,
    precision_at_k,
    precision_recall,
    rankdata,
    score_relevance,
    sharing_peers,
    spearman,
)

# ---- relevance EMA, selection, dynamic k ------------------------------------------------


def test_ema_updates_only_the_coalition():
    r = {"a": 0.0, "b": 0.4, "c": -0.2}
    out = ema_update(r, {"b": 0.2, "c": 0.6}, alpha=0.5)
    assert out == pytest.approx({"a": 0.0, "b": 0.3, "c": 0.2})
    assert r["b"] == 0.4  # input untouched
    assert ema_update({}, {"x": 1.0}, alpha=0.25) == {"x": 0.75}
    with pytest.raises(ValueError):
        ema_update(r, {}, alpha=1.5)


def test_top_k_breaks_ties_at_random_and_prefers_unseen_and_reachable():
    scores = {p: 0.0 for p in "abcdef"}
    picks = Counter()
    for seed in range(600):
        picks.update(top_k(scores, 2, rng=np.random.default_rng(seed)))
    # Uniform over 6 peers, 2 slots: each picked ~200 times out of 600.
    assert all(150 < c < 250 for c in picks.values()) and len(picks) == 6
    scores = {"a": 0.5, "b": 0.0, "c": 0.0, "d": -0.1, "e": 0.2}
    ranked = rank_peers(scores, rng=np.random.default_rng(0), seen={"a", "b", "d", "e"})
    assert ranked == ["a", "e", "c", "b", "d"]  # unseen c before the scored null player b
    first, second = top_k(scores, 2, rng=np.random.default_rng(0), avoid={"a"})
    assert first == "e" and second in {"b", "c"}  # a's last fetch failed: its slot passes on
    assert rank_peers(scores, avoid={"a"})[-1] == "a"
    assert top_k(scores, 10, rng=np.random.default_rng(0)) and len(top_k(scores, 10)) == 5


def test_next_k_counts_positive_peers_plus_exploration_while_undecided_remain():
    r = {"a": 0.3, "b": -0.1, "c": 0.0, "d": 0.0}
    assert next_k(r, k_min=1) == 2  # a + one of the peers at 0
    assert next_k(r, k_min=3) == 3  # a + both
    assert next_k({"a": 0.3, "b": -0.1, "c": -0.2}, k_min=3) == 1  # all decided: k = #positive
    assert next_k({"a": -0.1}, k_min=2) == 0
    with pytest.raises(ValueError):
        next_k(r, k_min=0)


def test_stalest_prefers_never_scored_then_oldest():
    last = {"a": 3, "b": 1, "c": 2}
    assert stalest(["a", "b", "c", "d"], last, 2) == ["d", "b"]
    assert stalest(["a", "b", "c"], last, 5, avoid={"b"}) == ["c", "a"]
    ties = {tuple(stalest(["x", "y", "z"], {}, 1, rng=np.random.default_rng(s))) for s in range(30)}
    assert len(ties) == 3
    assert stalest(["a"], last, 0) == []


def test_pfedsv_weights_follow_eq6_with_the_mean_distance_for_the_own_model():
    sv = [0.4, 0.2, -0.1, 0.3]
    d = [0.0, 2.0, 1.0, 4.0]  # own distance is replaced by mean(2, 1, 4) = 7/3
    raw = np.array([0.4 / (7 / 3), 0.2 / 2.0, 0.0, 0.3 / 4.0])
    assert pfedsv_weights(sv, d) == pytest.approx(raw / raw.sum())
    assert pfedsv_weights([-0.1, -0.2], [0.0, 1.0]).tolist() == [0.0, 0.0]
    assert pfedsv_weights([0.5], [0.0]).tolist() == [1.0]
    w = pfedsv_weights([0.1, 0.1], [0.0, 0.0])  # identical models: no division by zero
    assert np.isfinite(w).all() and w.sum() == pytest.approx(1.0)


def test_fedfomo_weights_use_loss_gain_per_distance():
    w = fedfomo_weights(1.0, [0.5, 1.2, 0.8, 0.9], [1.0, 1.0, 0.5, 0.0])
    raw = np.array([0.5, 0.0, 0.2 / 0.5, 0.0])  # worse model -> 0, zero distance -> 0
    assert w == pytest.approx(raw / raw.sum())
    assert fedfomo_weights(1.0, [1.5, 2.0], [1.0, 1.0]).tolist() == [0.0, 0.0]


def test_epsilon_greedy_exploits_at_zero_and_explores_at_one():
    scores = {"a": 3.0, "b": 2.0, "c": 1.0, "d": 0.0, "e": -1.0}
    rng = np.random.default_rng(0)
    assert epsilon_greedy(scores, 3, 0.0, rng) == ["a", "b", "c"]
    assert epsilon_greedy(scores, 2, 0.0, rng, avoid={"a"}) == ["b", "c"]
    picks = Counter()
    for _ in range(500):
        chosen = epsilon_greedy(scores, 2, 1.0, rng)
        assert len(set(chosen)) == 2
        picks.update(chosen)
    assert picks["e"] > 100  # fully random: the worst peer is drawn ~200 times


# ---- the discovery bound ------------------------------------------------------------------


def paper_bound(n: int, m: int, k: int) -> int:
    """Section IV-B: rounds to find all m relevant peers among n nodes with k downloads."""
    if m <= k:
        return math.ceil((n - m - 1) / k) + 1
    return math.ceil((n - m - 1) / k) + math.ceil(m / k)


def discover(n, m, k, k_min, *, order=None, seed=0, rule=next_k, alpha=0.5, max_rounds=500):
    """Rounds until every relevant peer (ids 1..m) has positive relevance.

    SV is positive for relevant peers and negative otherwise, with random magnitudes, as in
    the paper's argument. `order` fixes the tie order (adversarial draws); else ties are random.
    """
    rng = np.random.default_rng(seed)
    peers = list(range(1, n))
    relevant = set(range(1, m + 1))
    relevance = dict.fromkeys(peers, 0.0)
    seen: set[int] = set()
    k_t = k
    for t in range(1, max_rounds + 1):
        chosen = top_k(relevance, k_t, rng=None if order else rng, seen=seen, order=order)
        sv = {j: (rng.uniform(0.01, 1) if j in relevant else -rng.uniform(0.01, 1)) for j in chosen}
        relevance = ema_update(relevance, sv, alpha)
        seen |= set(chosen)
        if all(relevance[j] > 0 for j in relevant):
            return t
        k_t = rule(relevance, k_min)
    raise AssertionError("never found all relevant peers")


def adversarial_orders(n, m):
    irrelevant = list(range(m + 1, n))
    relevant = list(range(1, m + 1))
    return {
        "irrelevant first (the paper's worst case)": irrelevant + relevant,
        "all but one relevant first": relevant[:-1] + irrelevant + relevant[-1:],
        "one relevant first": relevant[:1] + irrelevant + relevant[1:],
        "relevant last, reversed": irrelevant[::-1] + relevant[::-1],
    }


@pytest.mark.parametrize("n,m,k", [(10, 2, 3), (10, 2, 5), (20, 2, 5), (23, 2, 5), (20, 4, 5), (30, 3, 4),
                                   (10, 5, 3), (20, 7, 3), (12, 11, 3), (6, 1, 1)])
def test_dynamic_top_k_finds_all_relevant_peers_within_the_paper_bound(n, m, k):
    bound = paper_bound(n, m, k)
    worst = 0
    for name, order in adversarial_orders(n, m).items():
        rounds = discover(n, m, k, k_min=k, order=order)
        assert rounds <= bound, f"{name}: {rounds} > {bound}"
        worst = max(worst, rounds)
    for seed in range(300):
        rounds = discover(n, m, k, k_min=k, seed=seed)
        assert rounds <= bound, f"seed {seed}: {rounds} > {bound}"
    # k new peers per round: everything is scanned after ceil((n-1)/k) <= bound rounds, and
    # hiding the last relevant peer at the end of the tie order attains exactly that.
    assert worst == math.ceil((n - 1) / k) <= bound


@pytest.mark.parametrize("k_min", [1, 2])
def test_smaller_k_min_scans_k_min_new_peers_per_round(k_min):
    n, m, k = 15, 2, 4
    bound = 1 + math.ceil((n - 1 - k) / k_min)
    for order in adversarial_orders(n, m).values():
        assert discover(n, m, k, k_min=k_min, order=order) <= bound
    for seed in range(100):
        assert discover(n, m, k, k_min=k_min, seed=seed) <= bound


def test_plain_max_rule_lets_known_peers_crowd_out_exploration():
    """k = max(#positive, k_min) (top-k with positives taking slots) exceeds the paper's bound
    on an adversarial draw: the paper's proof only considers "no relevant peer until the end"."""

    def literal(relevance, k_min):
        positive = sum(1 for r in relevance.values() if r > 0)
        return max(positive, k_min) if any(r == 0 for r in relevance.values()) else positive

    n, m, k = 23, 2, 5
    order = adversarial_orders(n, m)["one relevant first"]
    assert discover(n, m, k, k_min=k, order=order, rule=literal) == 6 > paper_bound(n, m, k) == 5
    assert discover(n, m, k, k_min=k, order=order) == 5


def test_after_discovery_k_converges_to_the_number_of_relevant_peers():
    n, m, k = 12, 3, 4
    relevance = dict.fromkeys(range(1, n), 0.0)
    seen: set[int] = set()
    k_t, rng = k, np.random.default_rng(0)
    for _ in range(10):
        chosen = top_k(relevance, k_t, rng=rng, seen=seen)
        relevance = ema_update(relevance, {j: 1.0 if j <= m else -1.0 for j in chosen}, 0.5)
        seen |= set(chosen)
        k_t = next_k(relevance, k_min=k)
    assert k_t == m and sorted(top_k(relevance, k_t, rng=rng, seen=seen)) == [1, 2, 3]


# ---- scoring -------------------------------------------------------------------------------


def test_label_distribution_and_overlap():
    p = label_distribution([0, 0, 1, 3], 4)
    assert p.tolist() == [0.5, 0.25, 0.0, 0.25]
    q = label_distribution([1, 1, 2, 2], 4)
    assert label_overlap(p, q) == pytest.approx(0.25)
    assert label_overlap(p, p) == pytest.approx(1.0)
    assert label_overlap([1, 0], [0, 1]) == 0.0
    m = overlap_matrix([p, q, [0, 0, 1, 0]])
    assert m[0, 1] == pytest.approx(0.25) and m[1, 2] == pytest.approx(0.5) and m[0, 2] == 0.0
    assert np.allclose(np.diag(m), 1.0)
    assert label_distribution([], 3).tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        label_distribution([5], 3)


def test_precision_recall_and_precision_at_k():
    assert precision_recall({"a", "b", "c"}, {"a", "d"}) == (pytest.approx(1 / 3), 0.5)
    p, r = precision_recall(set(), {"a"})
    assert math.isnan(p) and r == 0.0
    scores = {"a": 0.9, "b": 0.1, "c": 0.5, "d": -0.2}
    assert precision_at_k(scores, {"a", "b"}, 2) == 0.5  # top-2 = a, c
    assert precision_at_k(scores, {"a", "c"}, 2) == 1.0
    assert math.isnan(precision_at_k(scores, {"a"}, 0))


def test_spearman_matches_scipy_including_ties():
    from scipy import stats

    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.integers(0, 5, size=12).astype(float)
        y = x + rng.normal(0, 2, size=12)
        assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
        assert rankdata(x) == pytest.approx(stats.rankdata(x))
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_score_relevance_on_a_pathological_split():
    own = label_distribution([0] * 5 + [1] * 5, 4)
    peers = {
        "b": label_distribution([1] * 5 + [2] * 5, 4),  # shares class 1
        "c": label_distribution([0] * 8 + [3] * 2, 4),  # shares class 0, more
        "d": label_distribution([2] * 5 + [3] * 5, 4),  # disjoint
        "e": label_distribution([3] * 10, 4),  # disjoint
    }
    assert sharing_peers(own, peers) == {"b", "c"}
    perfect = score_relevance({"b": 0.2, "c": 0.3, "d": -0.1, "e": -0.3}, own, peers)
    assert perfect["precision"] == 1.0 and perfect["recall"] == 1.0 and perfect["precision_at_k"] == 1.0
    assert perfect["spearman"] == pytest.approx(spearman([0.2, 0.3, -0.1, -0.3], [0.5, 0.5, 0, 0]))
    wrong = score_relevance({"b": -0.2, "c": 0.3, "d": 0.1, "e": 0.0}, own, peers, k=1)
    assert wrong["precision"] == 0.5 and wrong["recall"] == 0.5 and wrong["precision_at_k"] == 1.0
