"""`PrivacySpec.from_dict` names the wrong field; `build_privacy` picks the mechanism."""

from __future__ import annotations

import dataclasses

import pytest

from p2pfl.errors import ConfigError
from p2pfl.privacy import DPSGDMechanism, OutputNoiseMechanism, PrivacySpec, build_privacy

DP = {"mode": "dp-sgd", "noise_multiplier": 1.0}


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ({"colour": 1}, "privacy.colour"),
        ({**DP, "noise": 1}, "privacy.noise"),
        ({"mode": "magic"}, "privacy.mode"),
        ({"mode": 3}, "privacy.mode"),
        ({"mode": "dp-sgd", "noise_multiplier": "high"}, "privacy.noise_multiplier"),
        ({"mode": "dp-sgd", "noise_multiplier": True}, "privacy.noise_multiplier"),
        ({"mode": "dp-sgd", "noise_multiplier": -0.5}, "privacy.noise_multiplier"),
        ({"mode": "dp-sgd", "noise_multiplier": float("nan")}, "privacy.noise_multiplier"),
        ({"mode": "dp-sgd"}, "privacy.noise_multiplier"),
        ({"mode": "output-noise"}, "privacy.noise_multiplier"),
        ({**DP, "target_epsilon": 3.0}, "privacy.target_epsilon"),
        ({"mode": "dp-sgd", "target_epsilon": 0}, "privacy.target_epsilon"),
        ({**DP, "delta": 0}, "privacy.delta"),
        ({**DP, "delta": 1.0}, "privacy.delta"),
        ({**DP, "delta": "1e-5"}, "privacy.delta"),
        ({**DP, "accountant": "gdp"}, "privacy.accountant"),
        ({**DP, "epsilon_budget": -1}, "privacy.epsilon_budget"),
        ({**DP, "max_grad_norm": 0}, "privacy.max_grad_norm"),
        ({**DP, "clip_norm": -1.0}, "privacy.clip_norm"),
        ({**DP, "poisson_sampling": "yes"}, "privacy.poisson_sampling"),
        ({**DP, "poisson_sampling": 1}, "privacy.poisson_sampling"),
        ({"noise_multiplier": 1.0}, "privacy.noise_multiplier"),  # mode "none" would ignore it
        ({"epsilon_budget": 5.0}, "privacy.epsilon_budget"),
    ],
)
def test_wrong_field_is_named(table, field):
    with pytest.raises(ConfigError) as info:
        PrivacySpec.from_dict(table)
    assert info.value.field == field, str(info.value)


def test_not_a_table_and_custom_prefix():
    with pytest.raises(ConfigError) as info:
        PrivacySpec.from_dict(["dp-sgd"])
    assert info.value.field == "privacy"
    with pytest.raises(ConfigError) as info:
        PrivacySpec.from_dict({"mode": "dp"}, prefix="node.privacy")
    assert info.value.field == "node.privacy.mode"


def test_values_are_typed_and_round_trip():
    spec = PrivacySpec.from_dict({"mode": "dp-sgd", "target_epsilon": 8, "max_grad_norm": 2, "accountant": "prv",
                                  "epsilon_budget": 10, "poisson_sampling": False})
    assert spec.target_epsilon == 8.0 and isinstance(spec.target_epsilon, float)
    assert (spec.max_grad_norm, spec.accountant, spec.poisson_sampling, spec.noise_multiplier) == (2.0, "prv", False, None)
    assert PrivacySpec.from_dict(dataclasses.asdict(spec)) == spec  # a resolved scenario loads again
    assert PrivacySpec.from_dict({}) == PrivacySpec() and not PrivacySpec().enabled


def test_build_privacy_picks_the_mechanism():
    kw = dict(n_train=100, batch_size=10, epochs=2, rounds=3, seed=0)
    assert build_privacy(PrivacySpec(), **kw) is None
    dp = build_privacy(PrivacySpec.from_dict(DP), **kw)
    assert isinstance(dp, DPSGDMechanism)
    assert (dp.sample_rate, dp.round_steps, dp.noise_multiplier) == (0.1, 20, 1.0)
    out = build_privacy(PrivacySpec.from_dict({"mode": "output-noise", "noise_multiplier": 0.5, "clip_norm": 3}), **kw)
    assert isinstance(out, OutputNoiseMechanism) and (out.noise_multiplier, out.clip_norm) == (0.5, 3.0)


def test_unreachable_target_epsilon_is_a_config_error():
    spec = PrivacySpec.from_dict({"mode": "output-noise", "target_epsilon": 1e-9})
    with pytest.raises(ConfigError) as info:
        build_privacy(spec, n_train=100, batch_size=10, epochs=1, rounds=5, seed=0)
    assert info.value.field == "privacy.target_epsilon"
