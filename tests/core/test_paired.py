"""Paired differences over seeds against scipy's paired t test, and the holds/level rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from p2pfl.core.paired import MIN_SEEDS, paired_difference


def test_matches_scipys_paired_t_test_and_its_interval() -> None:
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(2, 9))
        a, b = rng.normal(0.9, 0.02, n), rng.normal(0.9, 0.02, n)
        d = paired_difference(dict(enumerate(a)), dict(enumerate(b)))
        ref = stats.ttest_rel(a, b)
        assert d.p_value == pytest.approx(ref.pvalue, rel=1e-9)
        low, high = ref.confidence_interval(0.95)
        assert (d.low, d.high) == pytest.approx((low, high), rel=1e-9)
        assert d.mean == pytest.approx(float(np.mean(a - b)))


def test_verdict_needs_significance_over_at_least_five_seeds() -> None:
    b = {s: 0.90 for s in range(5)}
    a = {s: 0.92 + 0.001 * s for s in range(5)}  # +2 points every seed, small spread
    assert paired_difference(a, b).verdict == "higher"
    assert paired_difference(b, a).verdict == "lower"
    four = {s: v for s, v in a.items() if s < 4}
    assert paired_difference(four, b).verdict == "level"  # significant, but under MIN_SEEDS seeds
    assert MIN_SEEDS == 5
    noisy = {0: 0.95, 1: 0.86, 2: 0.93, 3: 0.88, 4: 0.94}
    assert paired_difference(noisy, b).verdict == "level"  # mean +1.2, within the noise


def test_pairs_by_seed_and_leaves_out_missing_ones() -> None:
    a = {0: 0.5, 1: 0.6, 2: None, 7: 0.9}
    b = {1: 0.5, 0: 0.4, 2: 0.3}
    d = paired_difference(a, b)
    assert d.seeds == (0, 1) and d.mean == pytest.approx(0.1)
    one = paired_difference({0: 0.5}, {0: 0.4})
    assert one.verdict == "level" and math.isnan(one.p_value) and "n=1" in one.cell()
    assert paired_difference({}, {0: 0.4}).cell() == "-"
    same = paired_difference({s: 0.5 for s in range(5)}, {s: 0.4 for s in range(5)})
    assert same.p_value == 0.0 and same.verdict == "higher" and same.low == same.high == pytest.approx(0.1)


def test_holm_matches_its_definition_on_random_p_values() -> None:
    import itertools
    import random

    from p2pfl.core.paired import holm

    rng = random.Random(0)
    for m in range(1, 7):
        for _ in range(50):
            p = {f"t{i}": rng.random() ** 3 for i in range(m)}
            adjusted = holm(p)
            order = sorted(p, key=lambda k: (p[k], k))
            for rank, name in enumerate(order):  # max over the earlier ones of (m - j) p_(j), capped at 1
                expected = max(min(1.0, (m - j) * p[order[j]]) for j in range(rank + 1))
                assert abs(adjusted[name][0] - expected) < 1e-12
                assert adjusted[name][1] == (expected < 0.05)
            # Step-down: rejecting is monotone in the raw p-value.
            for a, b in itertools.combinations(order, 2):
                assert not (adjusted[b][1] and not adjusted[a][1])


def test_holm_is_stricter_than_each_test_alone() -> None:
    from p2pfl.core.paired import holm

    adjusted = holm({"a": 0.01, "b": 0.02, "c": 0.04})
    assert [adjusted[k][0] for k in "abc"] == [pytest.approx(0.03), pytest.approx(0.04), pytest.approx(0.04)]
    assert all(adjusted[k][1] for k in "abc")
    assert holm({"a": 0.03, "b": 0.04})["a"] == (pytest.approx(0.06), False)


def test_holm_corrected_takes_the_verdict_from_the_adjusted_p() -> None:
    """Hand-worked: raw p 0.03 and 0.04 are each significant alone; Holm over the two gives
    2 x 0.03 = 0.06 and max(0.06, 0.04) = 0.06, so neither claim holds."""
    from p2pfl.core.paired import PairedDifference, holm_corrected

    seeds = tuple(range(5))
    tests = {"a": PairedDifference(seeds, 0.02, 0.001, 0.04, 0.03, "higher"),
             "b": PairedDifference(seeds, -0.01, -0.02, -0.001, 0.04, "lower"),
             "few": PairedDifference((0,), 0.5, math.nan, math.nan, math.nan, "level")}
    out = holm_corrected(tests)
    assert out["a"].p_holm == pytest.approx(0.06) and out["b"].p_holm == pytest.approx(0.06)
    assert out["a"].verdict == out["b"].verdict == "level"
    assert out["a"].p_value == 0.03  # the raw p stays, beside the corrected one
    assert "p=0.03 (Holm 0.06) level" in out["a"].cell()
    assert out["few"] == tests["few"]  # no p: not in the family
    strong = holm_corrected({"a": tests["a"], "c": PairedDifference(seeds, 0.05, 0.04, 0.06, 0.001, "higher")})
    assert strong["c"].p_holm == pytest.approx(0.002) and strong["c"].verdict == "higher"
    assert strong["a"].p_holm == pytest.approx(0.03) and strong["a"].verdict == "higher"


def test_compare_table_corrects_over_every_cell() -> None:
    from p2pfl.core.paired import holm, paired_difference
    from p2pfl.scenario.compare import paired_table

    def run(seed: int, final: float, aggregated: float) -> dict:
        return {"seed": seed, "final": final, "final_aggregated": aggregated}

    noise = [0.001, -0.002, 0.0015, -0.001, 0.0005]
    rows = {"local": [run(s, 0.5, 0.5) for s in range(5)],
            "fedavg": [run(s, 0.51 + noise[s], 0.5 + noise[s]) for s in range(5)],
            "pfedsv": [run(s, 0.503 + 3 * noise[s], 0.49 - noise[s]) for s in range(5)]}
    table = paired_table(rows, "local")
    assert set(table) == {(r, k) for r in ("fedavg", "pfedsv") for k in ("final", "final_aggregated")}
    raw = {f"{r}/{k}": paired_difference({x["seed"]: x[k] for x in rows[r]}, {x["seed"]: x[k] for x in rows["local"]}).p_value
           for r, k in table}
    expected = holm(raw)
    for (r, k), d in table.items():
        assert d.p_value == pytest.approx(raw[f"{r}/{k}"])
        assert d.p_holm == pytest.approx(expected[f"{r}/{k}"][0])
        assert (d.verdict != "level") == expected[f"{r}/{k}"][1]
