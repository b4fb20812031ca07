"""DIA (DI eq. 12–15), the mixed-sign ξ mappings, and FedDG-GA's weight update."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest

from p2pfl.core.dia import (
    XI_MAPPINGS,
    dia,
    dia_weights,
    ga_step_size,
    ga_update,
    generalization_gap,
    influence_distribution,
    loss_distribution,
)

RNG = np.random.default_rng(0)


def test_equal_weights_as_alpha_and_beta_go_to_infinity() -> None:
    xi, phi = [0.3, -2.0, 5.0, 1.0], [10.0, 3.0, 7.0, 0.5]
    np.testing.assert_allclose(dia_weights(xi, phi, alpha=math.inf, beta=math.inf), np.full(4, 0.25))
    np.testing.assert_allclose(dia_weights(xi, phi, alpha=1e12, beta=1e12), np.full(4, 0.25), atol=1e-11)


def test_alpha_half_gives_xi_prime_exactly() -> None:
    xi, phi = np.array([0.2, 1.0, 3.0, 0.8]), [4.0, 1.0, 2.0, 3.0]
    terms = dia(xi, phi, alpha=0.5, beta=math.inf)
    np.testing.assert_allclose(terms.xi_prime, xi / xi.sum())  # the paper's ratio for positive ξ
    np.testing.assert_allclose(terms.w1, xi / xi.sum(), rtol=0, atol=1e-15)
    # eq. 12 still adds w2 = 1/n at β = ∞, so ω is the midpoint of ξ' and equal weights
    np.testing.assert_allclose(terms.omega, (xi / xi.sum() + 0.25) / 2)


def test_paper_formula_values() -> None:
    xi, phi = np.array([1.0, 3.0]), np.array([2.0, 6.0])
    alpha, beta = 2.0, 0.75
    xp, pp = xi / xi.sum(), phi / phi.sum()
    w1 = 0.5 + (xp - 0.5) / (2 * alpha)
    w2 = 0.5 + (np.exp(-pp) - 0.5) / (2 * beta)
    np.testing.assert_allclose(dia_weights(xi, phi, alpha=alpha, beta=beta), (w1 + w2) / (w1 + w2).sum())


def test_dic_off_uses_phi_only() -> None:
    phi = [1.0, 5.0, 2.0]
    terms = dia(None, phi, alpha=0.1, beta=1.0)
    np.testing.assert_allclose(terms.w1, np.full(3, 1 / 3))
    assert np.argmax(terms.omega) == 0 and np.argmin(terms.omega) == 1  # lower loss, more weight


@pytest.mark.parametrize("mapping", XI_MAPPINGS)
def test_weights_are_a_distribution_for_any_input(mapping: str) -> None:
    cases = [RNG.normal(size=n) * 10.0 ** RNG.integers(-12, 12) for n in (1, 2, 3, 5, 8) for _ in range(20)]
    cases += [np.array([1e300, -1e300, 0.0]), np.array([-1e-300, 1e-300]), np.zeros(4), np.full(3, -2.0),
              np.array([1e308, 1e308, -1e308])]
    for xi in cases:
        n = len(xi)
        for phi in (RNG.exponential(size=n) * 10.0 ** RNG.integers(-5, 5), np.full(n, 1e308), np.zeros(n)):
            for alpha, beta in [(1e-6, 1e-6), (0.01, 1.0), (0.5, math.inf), (1.0, 1.0), (math.inf, 0.01)]:
                w = dia_weights(xi, phi, alpha=alpha, beta=beta, mapping=mapping)
                assert w.shape == (n,) and np.isfinite(w).all()
                assert (w >= 0).all() and w.sum() == pytest.approx(1.0, abs=1e-12)


ORDER_PRESERVING = tuple(m for m in XI_MAPPINGS if m != "ratio")


@pytest.mark.parametrize("mapping", ORDER_PRESERVING)
def test_mappings_preserve_order_and_scale(mapping: str) -> None:
    for _ in range(200):
        xi = RNG.normal(size=RNG.integers(2, 9)) * 10.0 ** RNG.integers(-6, 6)
        p = influence_distribution(xi, mapping)
        assert (p >= 0).all() and p.sum() == pytest.approx(1.0)
        order = np.argsort(xi)
        assert (np.diff(p[order]) >= -1e-15).all(), (xi, p)  # non-decreasing in ξ
        np.testing.assert_allclose(influence_distribution(xi * 37.0, mapping), p, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(influence_distribution([2.0, 2.0, 2.0], mapping), np.full(3, 1 / 3))


def test_ratio_is_the_papers_eq_12_when_signs_agree() -> None:
    assert dict(inspect.signature(influence_distribution).parameters)["mapping"].default == "ratio"
    xi = np.array([-0.15, -0.30, -0.60, -0.20])
    p = influence_distribution(xi)
    np.testing.assert_allclose(p, xi / xi.sum())
    np.testing.assert_allclose(p, [0.12, 0.24, 0.48, 0.16])
    assert int(np.argmax(p)) == int(np.argmin(xi))  # all negative: the most negative ξ weighs most
    np.testing.assert_allclose(influence_distribution([1.0, 3.0]), [0.25, 0.75])  # all positive, as printed
    for _ in range(200):  # any one-signed ξ: exactly ξ/Σξ, and scale-invariant
        xi = RNG.exponential(size=RNG.integers(2, 9)) * 10.0 ** RNG.integers(-6, 6) * RNG.choice([-1.0, 1.0])
        np.testing.assert_allclose(influence_distribution(xi), xi / xi.sum(), rtol=1e-9)
        np.testing.assert_allclose(influence_distribution(xi * 37.0), xi / xi.sum(), rtol=1e-9)
    np.testing.assert_allclose(influence_distribution([0.0, 0.0]), [0.5, 0.5])


def test_ratio_fallback_for_mixed_signs() -> None:
    # the helpful direction (−ξ) only: harmful domains get 0, helpful ones share by magnitude
    np.testing.assert_allclose(influence_distribution([-1.0, 1.0, -3.0]), [0.25, 0.0, 0.75])
    # continuous as an entry crosses 0 from the all-negative regime
    np.testing.assert_allclose(influence_distribution([-1.0, -2.0, -1e-9]), influence_distribution([-1.0, -2.0, 1e-9]),
                               atol=1e-8)
    for _ in range(200):
        xi = RNG.normal(size=RNG.integers(2, 9)) * 10.0 ** RNG.integers(-6, 6)
        if (xi < 0).all() or (xi > 0).all():
            continue
        p = influence_distribution(xi)
        assert (p >= 0).all() and p.sum() == pytest.approx(1.0)
        assert (p[xi > 0] == 0).all()
        np.testing.assert_allclose(p[xi < 0], xi[xi < 0] / xi[xi < 0].sum(), rtol=1e-9)


def test_shift_mapping_details() -> None:
    np.testing.assert_allclose(influence_distribution([1.0, 3.0], "shift"), [0.25, 0.75])  # = ξ/Σξ
    # mixed signs: shift by the minimum; the smallest gets 0, order kept
    np.testing.assert_allclose(influence_distribution([-1.0, 1.0, 3.0], "shift"), [0.0, 2 / 6, 4 / 6])
    # all negative: the shift keeps the order, so it reverses the paper's ratio
    p = influence_distribution([-3.0, -1.0], "shift")
    np.testing.assert_allclose(p, [0.0, 1.0])
    # continuous as the smallest ξ crosses 0
    np.testing.assert_allclose(influence_distribution([1e-9, 1.0, 2.0], "shift"),
                               influence_distribution([-1e-9, 1.0, 2.0], "shift"), atol=1e-8)


def test_rank_and_softmax_details() -> None:
    np.testing.assert_allclose(influence_distribution([5.0, -1.0, 5.0], "rank"), [2.5 / 6, 1 / 6, 2.5 / 6])
    p = influence_distribution([-1e6, 0.0, 1.0], "softmax")
    assert p[0] < p[1] < p[2] and p[0] > 0
    sharper = influence_distribution([0.0, 1.0, 2.0], "softmax", temperature=0.1)
    assert sharper[2] > influence_distribution([0.0, 1.0, 2.0], "softmax")[2]


def test_invalid_inputs() -> None:
    with pytest.raises(ValueError):
        dia_weights([1.0, math.nan], [1.0, 1.0])
    with pytest.raises(ValueError):
        dia_weights([1.0, 2.0], [1.0, -1.0])
    with pytest.raises(ValueError):
        dia_weights([1.0, 2.0], [1.0, 1.0], alpha=0.0)
    with pytest.raises(ValueError):
        influence_distribution([1.0], "quotient")
    with pytest.raises(ValueError):
        dia_weights([1.0], [1.0, 2.0])


def test_loss_distribution() -> None:
    np.testing.assert_allclose(loss_distribution([1.0, 3.0]), [0.25, 0.75])
    np.testing.assert_allclose(loss_distribution([0.0, 0.0]), [0.5, 0.5])


# ---- GA -------------------------------------------------------------------------------------------
def test_ga_moves_weight_toward_the_larger_gap() -> None:
    a = np.full(3, 1 / 3)
    new = ga_update(a, [0.9, 0.1, 0.2], step=ga_step_size(1, 10, 3))
    assert new[0] > 1 / 3 > new[1] and new.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(new[0] - 1 / 3, 0.2 / 3, rtol=1e-12)  # the largest deviation moves by d_1 = d/n


def test_ga_weights_stay_in_unit_interval() -> None:
    for _ in range(300):
        n = int(RNG.integers(1, 7))
        a = RNG.dirichlet(np.ones(n))
        for r in range(1, 6):
            a = ga_update(a, RNG.normal(size=n) * 10.0 ** RNG.integers(-8, 8), RNG.uniform(0, 3), center=bool(RNG.integers(2)))
            assert (a >= 0).all() and (a <= 1).all() and a.sum() == pytest.approx(1.0)


def test_ga_equal_gaps_and_uncentred_variant() -> None:
    a = np.array([0.5, 0.3, 0.2])
    np.testing.assert_allclose(ga_update(a, [2.0, 2.0, 2.0], 0.1), a)
    # the official code's uncentred move: every weight +0.1·(gap/max gap), then renormalise
    raw = a + 0.1 * np.array([1.0, 0.5, 0.0])
    np.testing.assert_allclose(ga_update(a, [2.0, 1.0, 0.0], 0.1, center=False), raw / raw.sum())


def test_ga_step_decays_linearly() -> None:
    steps = [ga_step_size(r, 4, 2, 0.2) for r in range(1, 6)]
    np.testing.assert_allclose(steps, [0.1, 0.075, 0.05, 0.025, 0.0])


def test_generalization_gap_signs() -> None:
    assert generalization_gap(2.0, 0.5, "loss") == 1.5  # global has the higher loss
    assert generalization_gap(0.6, 0.9, "acc") == pytest.approx(0.3)  # global has the lower accuracy


def test_influence_shares_give_a_missing_xi_nothing() -> None:
    from p2pfl.core.dia import influence_shares

    np.testing.assert_allclose(influence_shares([None, -0.15, -0.30]), [0.0, 1 / 3, 2 / 3])
    np.testing.assert_allclose(influence_shares([None, None]), [0.5, 0.5])
    with pytest.raises(ValueError):
        influence_shares([None, math.nan, 1.0])
