"""Our ε (Opacus' RDP and PRV accountants) against Google's dp-accounting, an implementation that
shares no code with Opacus: its RDP accountant and its privacy-loss-distribution (PLD) accountant
on the same sampling rate, σ, steps and δ. RDP: within 1 % (the two libraries try different
Rényi orders); PRV against PLD, both numerical to a discretisation: within 1 %."""

from __future__ import annotations

import pytest

dp_accounting = pytest.importorskip("dp_accounting", reason="the audit extra: pip install -e '.[audit]'")

from dp_accounting import pld, rdp  # noqa: E402

from p2pfl.privacy import build_privacy  # noqa: E402
from p2pfl.privacy.accounting import epsilon_of  # noqa: E402
from p2pfl.privacy.output_noise import SENSITIVITY_FACTOR  # noqa: E402
from p2pfl.privacy.spec import PrivacySpec  # noqa: E402

DELTA = 1e-5
TOLERANCE = 0.01


def google_epsilon(sigma: float, sample_rate: float, steps: int, delta: float) -> tuple[float, float]:
    step = dp_accounting.GaussianDpEvent(sigma)
    if sample_rate < 1:
        step = dp_accounting.PoissonSampledDpEvent(sample_rate, step)
    event = dp_accounting.SelfComposedDpEvent(step, steps)
    by_rdp, by_pld = rdp.RdpAccountant(), pld.PLDAccountant(value_discretization_interval=1e-3)
    by_rdp.compose(event)
    by_pld.compose(event)
    return by_rdp.get_epsilon(delta), by_pld.get_epsilon(delta)


@pytest.mark.parametrize("sigma, sample_rate, steps", [
    (1.1, 1 / 13, 1300),       # DP-SGD: 390 images in batches of 32, 5 epochs, 20 rounds
    (0.8, 0.01, 10_000),
    (2.5, 1.0, 20),            # output noise: one Gaussian release a round, 20 rounds
    (1.0, 1.0, 100),
])
def test_our_accountants_agree_with_dp_accounting(sigma: float, sample_rate: float, steps: int) -> None:
    google_rdp, google_pld = google_epsilon(sigma, sample_rate, steps, DELTA)
    assert epsilon_of([(sigma, sample_rate, steps)], DELTA, "rdp") == pytest.approx(google_rdp, rel=TOLERANCE)
    assert epsilon_of([(sigma, sample_rate, steps)], DELTA, "prv") == pytest.approx(google_pld, rel=TOLERANCE)


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_a_node_planned_for_epsilon_four_spends_four_by_dp_accounting(accountant: str) -> None:
    spec = PrivacySpec.from_dict({"mode": "dp-sgd", "target_epsilon": 4.0, "delta": DELTA, "accountant": accountant},
                                 prefix="privacy")
    mechanism = build_privacy(spec, n_train=390, batch_size=32, epochs=5, rounds=20, seed=0)
    steps = 20 * mechanism.round_steps
    google_rdp, google_pld = google_epsilon(mechanism.noise_multiplier, mechanism.sample_rate, steps, DELTA)
    google = google_rdp if accountant == "rdp" else google_pld
    assert google == pytest.approx(4.0, rel=0.02)  # the target, as another library counts it


def test_output_noise_is_counted_at_its_sensitivity_by_both() -> None:
    """pFedSV's output noise at σ: each round a Gaussian release of sensitivity 2C with noise σC,
    i.e. noise multiplier σ/2 per round."""
    spec = PrivacySpec.from_dict({"mode": "output-noise", "noise_multiplier": 5.0, "delta": DELTA}, prefix="privacy")
    mechanism = build_privacy(spec, n_train=390, batch_size=32, epochs=5, rounds=20, seed=0)
    per_round = mechanism.noise_multiplier / SENSITIVITY_FACTOR
    assert mechanism.accounted_noise_multiplier == pytest.approx(per_round) == 2.5
    google_rdp, _ = google_epsilon(per_round, 1.0, 20, DELTA)
    assert epsilon_of([(per_round, 1.0, 20)], DELTA, "rdp") == pytest.approx(google_rdp, rel=TOLERANCE)
