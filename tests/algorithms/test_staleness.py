"""FedAvg's and FedProx's staleness weight (ours, FedAsync's (1 + τ)^-a): against the average
written out by hand over the same parts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from p2pfl.algorithms import build_strategy
from p2pfl.algorithms.fedavg import staleness_weight
from p2pfl.data import NodeData, Split
from p2pfl.models import cnn, part_state
from p2pfl.runtime.strategy import ArtefactSink, PeerModel, RoundContext
from p2pfl.training import LocalTrainer, TrainConfig


def _context(round_: int) -> RoundContext:
    torch.manual_seed(0)
    model = cnn(1, 8, 3)
    split = Split(torch.zeros(12, 1, 8, 8), torch.zeros(12, dtype=torch.long))
    return RoundContext(node_id="me", round=round_, rounds=9, peers=("p1", "p2"), model=model,
                        data=NodeData(0, split, split, split, None), trainer=LocalTrainer(TrainConfig(), seed=0),
                        rng=np.random.default_rng(0), artefacts=ArtefactSink("me", None))


def _part(seed: int, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(v.shape, generator=g) if v.is_floating_point() else v.clone() for k, v in like.items()}


@pytest.mark.parametrize("name", ["fedavg", "fedprox"])
@pytest.mark.parametrize("exponent", [0.0, 0.5, 2.0])
def test_a_stale_part_weighs_its_count_times_one_plus_tau_to_the_minus_a(name: str, exponent: float) -> None:
    ctx = _context(round_=5)
    own = {k: v.clone() for k, v in part_state(ctx.model, "full").items()}
    fresh, stale = _part(1, own), _part(2, own)
    arrivals = [PeerModel("p1", "full", 5, 5, fresh, {"n_train": 20}),
                PeerModel("p2", "full", 2, 2, stale, {"n_train": 30})]  # three rounds old
    strategy = build_strategy(name, {"staleness": exponent})
    strategy.configure_fetch(ctx)
    for arrival in arrivals:
        assert strategy.fold(ctx, arrival)
    strategy.aggregate(ctx, [PeerModel(a.sender, a.part, a.round, a.version, {}, a.meta) for a in arrivals])
    weights = [12.0, 20.0, 30.0 * (1 + 3) ** -exponent]
    for k, v in part_state(ctx.model, "full").items():
        if not v.is_floating_point():
            continue
        expected = sum(w * t[k].double() for w, t in zip(weights, (own, fresh, stale))) / sum(weights)
        assert torch.allclose(v.double(), expected, atol=1e-6), k


def test_the_weight_is_one_for_a_current_part_and_off_at_zero() -> None:
    assert staleness_weight(0, 2.0) == 1.0 and staleness_weight(-1, 2.0) == 1.0
    assert staleness_weight(4, 0.0) == 1.0
    assert staleness_weight(1, 1.0) == pytest.approx(0.5) and staleness_weight(3, 0.5) == pytest.approx(0.5)


def test_a_wrong_exponent_is_named() -> None:
    from p2pfl.errors import ConfigError

    for bad in (-1.0, float("inf")):
        with pytest.raises((ValueError, ConfigError), match="staleness"):
            build_strategy("fedavg", {"staleness": bad})
    with pytest.raises((ValueError, ConfigError), match="staleness"):
        build_strategy("fedavg", {"staleness": 1.0, "aggregation": "median"})
