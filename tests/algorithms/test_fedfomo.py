"""FedFomo driven in-process, on the synthetic world of test_pfedsv."""

from __future__ import annotations

import copy
from collections import Counter

import numpy as np
import pytest
import torch

from p2pfl.algorithms import build_strategy
from p2pfl.algorithms.fedfomo import FedFomo
from p2pfl.errors import ConfigError
from p2pfl.models import cnn, part_state
from p2pfl.training import LocalTrainer, TrainConfig
from .test_pfedsv import CLASSES, PEERS, arrivals, context, peer_model, saved, world  # noqa: F401


def test_round_one_draws_m_random_peers_and_exploration_decays():
    strategy = FedFomo(m=3)
    draws = Counter()
    for seed in range(200):
        ctx = context(cnn(1, 8, CLASSES), PEERS, seed=seed)
        fetches = strategy.configure_fetch(ctx)
        assert len({f.peer for f in fetches}) == 3 and all(f.part == "full" for f in fetches)
        draws.update(f.peer for f in fetches)
    assert set(draws) == set(PEERS) and min(draws.values()) > 50  # ~86 each
    assert strategy.exploration(1) == pytest.approx(0.3)
    assert strategy.exploration(3) == pytest.approx(0.2)
    assert strategy.exploration(7) == 0.0 and strategy.exploration(50) == 0.0


def test_weights_follow_first_order_gains_and_harmful_peers_get_none(world):
    base = copy.deepcopy(world["own"])  # theta_old: where this round's training started
    with torch.no_grad():
        for p in base.parameters():
            p.mul_(0.5)
    model = copy.deepcopy(world["own"])
    ctx = context(model, PEERS)
    ctx.round_start = {k: v.clone() for k, v in base.state_dict().items()}
    strategy = FedFomo(m=4)
    candidates = [world["own"], *world["good"], world["harmful"], world["noise"]]

    trainer = LocalTrainer(TrainConfig())
    base_loss = trainer.evaluate(base, ctx.data.val)[1]
    flat = lambda m: torch.cat([t.flatten().double() for t in m.state_dict().values()])  # noqa: E731
    raw = np.array([
        max(base_loss - trainer.evaluate(c, ctx.data.val)[1], 0.0) / float((flat(c) - flat(base)).norm())
        for c in candidates
    ])
    w = raw / raw.sum()
    expected = {k: sum(float(wi) * c.state_dict()[k] for wi, c in zip(w, candidates)) for k in model.state_dict()}

    strategy.aggregate(ctx, arrivals(world))
    got = saved(ctx, "fomo_weights")
    assert got["peers"] == ["me", "g1", "g2", "bad", "noise"]
    assert got["values"] == pytest.approx(w.tolist(), rel=1e-5, abs=1e-9)
    assert got["values"][3] == 0.0 and got["values"][4] == 0.0  # worse than theta_old
    assert got["values"][0] > 0  # the node's own trained model is a candidate
    for k, t in model.state_dict().items():
        torch.testing.assert_close(t, expected[k], rtol=1e-5, atol=1e-6)

    # Affinity accumulates the weights; with exploration over, the helpful peers come first.
    assert strategy.affinity["g1"] > 0 and strategy.affinity["bad"] == 0.0
    aff = saved(ctx, "affinity")
    assert aff["peers"] == PEERS and aff["values"][0] == pytest.approx(w[1], rel=1e-5)
    ctx.round = 10
    nxt = [f.peer for f in FedFomo.configure_fetch(strategy, ctx)]
    assert set(nxt[:2]) == {"g1", "g2"}
    assert ctx.artefacts.records["downloaded"] == ["g1", "g2", "bad", "noise"]


def test_without_round_start_the_current_model_is_the_baseline(world):
    model = copy.deepcopy(world["own"])
    ctx = context(model, PEERS)
    strategy = FedFomo(m=2)
    strategy.aggregate(ctx, [peer_model("noise", world["noise"])])
    got = saved(ctx, "fomo_weights")["values"]
    assert got == [0.0, 0.0]  # the own model sits at distance 0; noise is worse
    for k, v in model.state_dict().items():
        assert torch.equal(v, part_state(world["own"], "full")[k])
    assert ctx.artefacts.records["self_weight"] == 1.0


def test_no_arrivals_keeps_the_model():
    model = cnn(1, 8, CLASSES)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ctx = context(model, PEERS)
    FedFomo().aggregate(ctx, [])
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    assert ctx.artefacts.records["downloaded"] == []


def test_registry_validates_parameters():
    s = build_strategy("fedfomo", {"m": 2, "epsilon": 0.0})
    assert isinstance(s, FedFomo) and s.m == 2
    with pytest.raises(ConfigError):
        build_strategy("fedfomo", {"k": 2})
    with pytest.raises(ConfigError):
        build_strategy("fedfomo", {"epsilon": 2.0})
