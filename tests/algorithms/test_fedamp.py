"""FedAMP (ours, decentralised): the attention weights against a hand-computed example, and the
strategy's aggregate and proximal training against them."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from p2pfl.algorithms import build_strategy
from p2pfl.algorithms.fedamp import FedAMP
from p2pfl.core.attention import attention_weights, squared_distance
from p2pfl.models import cnn, part_state
from tests.algorithms.test_fedprox_fedrep import CLASSES, RecordingTrainer, context, peer
from tests.core.test_influence import perturbed


def test_attention_weights_by_hand() -> None:
    """w_i = (0, 0); peers (1, 0) and (0, 2): squared distances 1 and 4. With α_k = 0.5, σ = 2:
    ξ_i1 = 0.5 e^{-1/2} / 2 = 0.151633, ξ_i2 = 0.5 e^{-4/2} / 2 = 0.033834, ξ_ii = 0.814533."""
    own = {"w": torch.tensor([0.0, 0.0]), "steps": torch.tensor([7])}  # integers are no distance
    peers = [{"w": torch.tensor([1.0, 0.0]), "steps": torch.tensor([1])},
             {"w": torch.tensor([0.0, 2.0]), "steps": torch.tensor([2])}]
    assert [squared_distance(own, p) for p in peers] == [1.0, 4.0]
    own_weight, weights = attention_weights(own, peers, alpha_k=0.5, sigma=2.0)
    assert weights == pytest.approx([0.25 * math.exp(-0.5), 0.25 * math.exp(-2.0)], rel=1e-12)
    assert weights == pytest.approx([0.151633, 0.033834], abs=1e-6)
    assert own_weight == pytest.approx(0.814533, abs=1e-6)
    # Coefficients past 1 in sum are scaled to 1 (ξ_ii = 0), never a negative self weight.
    own_weight, weights = attention_weights(own, peers, alpha_k=10.0, sigma=0.5)
    assert own_weight == 0.0 and sum(weights) == pytest.approx(1.0)
    assert weights[0] / weights[1] == pytest.approx(math.exp(-1 / 0.5) / math.exp(-4 / 0.5))
    assert attention_weights(own, [], 1.0, 1.0) == (1.0, [])
    for bad in ((0.0, 1.0), (1.0, 0.0), (float("inf"), 1.0), (1.0, float("nan"))):
        with pytest.raises(ValueError):
            attention_weights(own, peers, *bad)


def test_fedamp_aggregates_the_personalised_cloud_model_and_trains_towards_it() -> None:
    torch.manual_seed(0)
    base = cnn(1, 8, CLASSES)
    peers = [perturbed(base, s) for s in (1, 2)]
    arrived = [peer("p1", peers[0], "full", 10), peer("p2", peers[1], "full", 90)]
    ctx = context(copy.deepcopy(base))
    strategy = FedAMP(alpha_k=0.5, lam=2.0, sigma=50.0)
    own = {k: v.clone() for k, v in part_state(ctx.model, "full").items()}  # before it is replaced
    strategy.aggregate(ctx, arrived)
    own_weight, weights = attention_weights(own, [m.tensors for m in arrived], 0.5, 50.0)
    assert 0 < own_weight < 1 and all(w > 0 for w in weights)
    for key, value in own.items():
        if value.is_floating_point():
            expected = own_weight * value.double() + sum(w * m.tensors[key].double() for w, m in zip(weights, arrived))
            assert torch.allclose(ctx.model.state_dict()[key].double(), expected, atol=1e-6), key
    # The next round trains from u_i with FedProx's term at μ = λ / α_k, anchored at the round's start.
    trainer = RecordingTrainer()
    ctx2 = context(copy.deepcopy(ctx.model), trainer)
    ctx2.round_start = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    strategy.fit(ctx2)
    probe = perturbed(ctx.model, 3)
    trainer.calls[0]["regularizer"](probe).backward()
    for name, p in probe.named_parameters():
        assert torch.allclose(p.grad, 4.0 * (p.detach() - ctx2.round_start[name]), atol=1e-6)


def test_fedamp_by_name_and_its_parameters_checked() -> None:
    strategy = build_strategy("fedamp", {"alpha_k": 0.1, "lam": 0.5, "sigma": 10.0})
    assert isinstance(strategy, FedAMP) and strategy.mu == pytest.approx(5.0) and strategy.shared_parts == ("full",)
    for bad in ({"sigma": 0}, {"alpha_k": -1}, {"lam": float("inf")}):
        with pytest.raises(Exception):
            build_strategy("fedamp", bad)
