"""FedAvgM and FedOpt's server optimisers against Reddi et al.'s Algorithm 2 worked by hand, over
two rounds of one scalar, and FedAvgM at β = 0, η = 1 being FedAvg."""

from __future__ import annotations

import math

import pytest
import torch

from p2pfl.core.server_opt import ServerOptimizer


def scalar(x: float) -> dict[str, torch.Tensor]:
    return {"w": torch.tensor([x], dtype=torch.float64), "steps": torch.tensor([7])}


def two_rounds(kind: str, **kw: float) -> tuple[float, float]:
    opt = ServerOptimizer(kind, **kw)
    x1 = float(opt.step(scalar(1.0), scalar(3.0))["w"])  # Δ₁ = 2
    x2 = float(opt.step(scalar(x1), scalar(x1 - 1.0))["w"])  # Δ₂ = -1
    return x1, x2


def test_fedavgm_by_hand() -> None:
    # m₁ = 2, x₁ = 1 + 0.5·2 = 2; m₂ = 0.9·2 − 1 = 0.8, x₂ = 2 + 0.5·0.8 = 2.4
    assert two_rounds("momentum", lr=0.5, beta1=0.9) == pytest.approx((2.0, 2.4))
    opt = ServerOptimizer("momentum", lr=1.0, beta1=0.0)
    assert float(opt.step(scalar(1.0), scalar(3.0))["w"]) == 3.0  # β = 0, η = 1: the aggregate itself, FedAvg


def test_fedadam_by_hand() -> None:
    # m₁ = 0.1·2 = 0.2, v₁ = 0.01·4 = 0.04, x₁ = 1 + 0.1·0.2/(0.2 + 0.001) ;
    # m₂ = 0.9·0.2 − 0.1 = 0.08, v₂ = 0.99·0.04 + 0.01·1 = 0.0496, x₂ = x₁ + 0.1·0.08/(√0.0496 + 0.001)
    x1 = 1 + 0.1 * 0.2 / (0.2 + 1e-3)
    x2 = x1 + 0.1 * 0.08 / (math.sqrt(0.0496) + 1e-3)
    assert two_rounds("adam", lr=0.1, beta1=0.9, beta2=0.99, tau=1e-3) == pytest.approx((x1, x2))


def test_fedyogi_by_hand() -> None:
    # v₁ = 0 − 0.01·4·sign(0 − 4) = 0.04; v₂ = 0.04 − 0.01·1·sign(0.04 − 1) = 0.05
    x1 = 1 + 0.1 * 0.2 / (0.2 + 1e-3)
    x2 = x1 + 0.1 * 0.08 / (math.sqrt(0.05) + 1e-3)
    assert two_rounds("yogi", lr=0.1, beta1=0.9, beta2=0.99, tau=1e-3) == pytest.approx((x1, x2))


def test_fedadagrad_by_hand() -> None:
    # β₁ = 0: m = Δ; v₁ = 4, v₂ = 5
    x1 = 1 + 0.1 * 2 / (2 + 1e-3)
    x2 = x1 + 0.1 * -1 / (math.sqrt(5) + 1e-3)
    assert two_rounds("adagrad", lr=0.1, beta1=0.0, tau=1e-3) == pytest.approx((x1, x2))


def test_integer_tensors_take_the_aggregate_and_bad_settings_are_named() -> None:
    out = ServerOptimizer("adam").step(scalar(1.0), {"w": torch.tensor([2.0], dtype=torch.float64), "steps": torch.tensor([9])})
    assert int(out["steps"]) == 9
    with pytest.raises(ValueError, match="unknown server optimizer 'sgd'"):
        ServerOptimizer("sgd")
    with pytest.raises(ValueError, match="tau > 0"):
        ServerOptimizer("adam", tau=0.0)
