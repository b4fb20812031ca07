"""FedProx and FedRep driven in-process, without a network."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch

from p2pfl.algorithms import build_strategy
from p2pfl.algorithms.fedavg import FedAvg
from p2pfl.algorithms.fedprox import FedProx, proximal_term
from p2pfl.algorithms.fedrep import FedRep
from p2pfl.data import NodeData, Split
from p2pfl.errors import ConfigError
from p2pfl.models import SplitModel, cnn, load_part, part_state
from p2pfl.runtime.strategy import ArtefactSink, Fetch, PeerModel, RoundContext
from p2pfl.training import FitResult, LocalTrainer, TrainConfig
from tests.core.test_influence import perturbed

CLASSES = 3


def make_split(n: int, seed: int) -> Split:
    g = torch.Generator().manual_seed(seed)
    protos = torch.randn(CLASSES, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    y = torch.randint(CLASSES, (n,), generator=g)
    return Split(protos[y] + 0.8 * torch.randn(n, 1, 8, 8, generator=g), y)


def make_data(seed: int = 0) -> NodeData:
    return NodeData(0, make_split(32, seed), make_split(10, seed + 1), make_split(10, seed + 2), None)


class RecordingTrainer(LocalTrainer):
    """A LocalTrainer that remembers each fit's trained parameters, regularizer and states before/after."""

    def __init__(self) -> None:
        super().__init__(TrainConfig(epochs=2, batch_size=16, lr=1e-2), seed=0)
        self.calls: list[dict[str, Any]] = []

    def fit(self, model, split, *, epochs=None, params=None, regularizer=None) -> FitResult:
        params = None if params is None else list(params)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        result = super().fit(model, split, epochs=epochs, params=params, regularizer=regularizer)
        self.calls.append({
            "params": None if params is None else {id(p) for p in params}, "epochs": epochs,
            "regularizer": regularizer, "before": before,
            "after": {k: v.clone() for k, v in model.state_dict().items()}, "result": result,
        })
        return result


def context(model: SplitModel, trainer: LocalTrainer | None = None, peers=("p1", "p2")) -> RoundContext:
    return RoundContext(
        node_id="me", round=1, rounds=3, peers=tuple(peers), model=model, data=make_data(),
        trainer=trainer or RecordingTrainer(), rng=np.random.default_rng(0),
        artefacts=ArtefactSink("me", None), log=lambda _: None,
    )


def peer(sender: str, model: SplitModel, part: str, n_train: int) -> PeerModel:
    return PeerModel(sender, part, 1, 1, {k: v.clone() for k, v in part_state(model, part).items()}, {"n_train": n_train})


def changed(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], prefix: str) -> bool:
    return any(not torch.equal(a[k], b[k]) for k in a if k.startswith(prefix))


# ---- FedProx ---------------------------------------------------------------------------------
def test_proximal_gradient_is_mu_times_the_distance_to_the_round_start():
    torch.manual_seed(0)
    start = cnn(1, 8, CLASSES)
    model = perturbed(start, 1)
    mu = 0.37
    reg = proximal_term(mu, start.state_dict())
    value = reg(model)
    value.backward()
    expected_value = 0.5 * mu * sum(float((p.detach() - start.state_dict()[n]).pow(2).sum()) for n, p in model.named_parameters())
    assert float(value.detach()) == pytest.approx(expected_value, rel=1e-5)
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, mu * (p.detach() - start.state_dict()[name]), atol=1e-7), name


def test_fedprox_fit_anchors_on_ctx_round_start():
    torch.manual_seed(0)
    start = cnn(1, 8, CLASSES)
    model = perturbed(start, 1)  # the model drifted since the round began: the anchor is the start
    trainer = RecordingTrainer()
    ctx = context(model, trainer)
    ctx.round_start = {k: v.clone() for k, v in start.state_dict().items()}
    FedProx(mu=0.5).fit(ctx)
    reg = trainer.calls[0]["regularizer"]
    probe = perturbed(start, 2)
    reg(probe).backward()
    for name, p in probe.named_parameters():
        assert torch.allclose(p.grad, 0.5 * (p.detach() - start.state_dict()[name]), atol=1e-7)
    # Without a round start (a hand-built context) the model at fit time is the anchor.
    trainer2 = RecordingTrainer()
    ctx2 = context(copy.deepcopy(start), trainer2)
    FedProx(mu=0.5).fit(ctx2)
    assert float(trainer2.calls[0]["regularizer"](start).detach()) == 0.0


def test_fedprox_pulls_towards_the_start_and_mu_zero_is_fedavg():
    torch.manual_seed(0)
    start = cnn(1, 8, CLASSES)

    def drift(mu: float) -> float:
        model = copy.deepcopy(start)
        ctx = context(model, RecordingTrainer())
        ctx.round_start = {k: v.clone() for k, v in start.state_dict().items()}
        FedProx(mu=mu).fit(ctx)
        return sum(float((p.detach() - start.state_dict()[n]).pow(2).sum()) for n, p in model.named_parameters())

    assert drift(100.0) < 0.5 * drift(0.0)
    trainer = RecordingTrainer()
    FedProx(mu=0.0).fit(context(copy.deepcopy(start), trainer))
    assert trainer.calls[0]["regularizer"] is None


def test_fedprox_aggregates_like_fedavg():
    torch.manual_seed(0)
    base = cnn(1, 8, CLASSES)
    peers = [perturbed(base, s) for s in (1, 2)]
    arrived = [peer("p1", peers[0], "full", 10), peer("p2", peers[1], "full", 90)]
    a, b = context(copy.deepcopy(base)), context(copy.deepcopy(base))
    FedProx().aggregate(a, arrived)
    FedAvg().aggregate(b, arrived)
    for k, v in b.model.state_dict().items():
        assert torch.equal(a.model.state_dict()[k], v)
    assert FedProx.shared_parts == ("full",)
    assert FedProx().configure_fetch(a) == [Fetch("p1", "full"), Fetch("p2", "full")]


def test_fedprox_parameters():
    assert build_strategy("fedprox").mu == 0.01
    assert build_strategy("fedprox", {"mu": 0.1}).mu == 0.1
    with pytest.raises(ConfigError, match="-1"):
        build_strategy("fedprox", {"mu": -1})


# ---- FedRep ----------------------------------------------------------------------------------
def test_fedrep_trains_the_head_then_the_body_with_the_other_frozen():
    torch.manual_seed(0)
    model = cnn(1, 8, CLASSES)
    trainer = RecordingTrainer()
    result = FedRep(head_epochs=1).fit(context(model, trainer))
    head_phase, body_phase = trainer.calls
    assert head_phase["params"] == {id(p) for p in model.head.parameters()} and head_phase["epochs"] == 1
    assert changed(head_phase["before"], head_phase["after"], "head.")
    assert not changed(head_phase["before"], head_phase["after"], "body.")
    assert body_phase["params"] == {id(p) for p in model.body.parameters()} and body_phase["epochs"] is None
    assert changed(body_phase["before"], body_phase["after"], "body.")
    assert not changed(body_phase["before"], body_phase["after"], "head.")
    assert result.steps == head_phase["result"].steps + body_phase["result"].steps
    assert result.loss == body_phase["result"].loss
    # Every parameter is trainable again after the round.
    assert all(p.requires_grad for p in model.parameters())


def test_fedrep_shares_and_fetches_only_the_body_and_keeps_the_head_personal():
    torch.manual_seed(0)
    base = cnn(1, 8, CLASSES)
    own = copy.deepcopy(base)
    peers = [perturbed(base, s) for s in (1, 2)]
    ctx = context(own)
    strategy = FedRep()
    assert strategy.shared_parts == ("body",)
    assert strategy.configure_fetch(ctx) == [Fetch("p1", "body"), Fetch("p2", "body")]
    head_before = {k: v.clone() for k, v in part_state(own, "head").items()}
    counts = [len(ctx.data.train), 10, 90]
    strategy.aggregate(ctx, [peer("p1", peers[0], "body", 10), peer("p2", peers[1], "body", 90)])
    for k, v in head_before.items():
        assert torch.equal(part_state(own, "head")[k], v)
    states = [part_state(m, "body") for m in (base, *peers)]
    for k in states[0]:
        expected = sum(c * s[k].double() for c, s in zip(counts, states)) / sum(counts)
        assert torch.allclose(part_state(own, "body")[k].double(), expected, atol=1e-6)
    assert ctx.artefacts.records["aggregated_from"] == ["p1", "p2"]


def test_fedrep_parameters():
    strategy = build_strategy("fedrep", {"head_epochs": 3, "body_epochs": 2})
    assert (strategy.head_epochs, strategy.body_epochs) == (3, 2)
    with pytest.raises(ConfigError, match="-1"):
        build_strategy("fedrep", {"head_epochs": -1})


def test_fedavg_folding_arrivals_one_by_one_gives_the_all_at_once_average() -> None:
    torch.manual_seed(0)
    model = cnn(1, 8, CLASSES)
    own = {k: v.clone() for k, v in part_state(model, "full").items()}
    peers = [peer(f"p{i}", perturbed(model, seed=i + 1), "full", 10 * (i + 1)) for i in range(3)]
    reference = copy.deepcopy(model)
    FedAvg().aggregate(context(reference, peers=("p0", "p1", "p2")), peers)  # handed over whole
    folding = FedAvg()
    ctx = context(model, peers=("p0", "p1", "p2"))
    assert [f.peer for f in folding.configure_fetch(ctx)] == ["p0", "p1", "p2"]
    for m in reversed(peers):  # any arrival order
        folding.fold(ctx, m)
    folding.aggregate(ctx, [PeerModel(m.sender, m.part, m.round, m.version, {}, m.meta) for m in peers])
    counts = [32.0, 10.0, 20.0, 30.0]  # own 32 training samples, then the peers'
    expected = {k: sum(c * s[k] for c, s in zip(counts, [own] + [m.tensors for m in peers])) / sum(counts)
                for k in own if own[k].is_floating_point()}
    for k, v in expected.items():
        torch.testing.assert_close(part_state(model, "full")[k], v, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(part_state(model, "full")[k], part_state(reference, "full")[k], rtol=1e-7, atol=1e-7)


def test_fedavg_sum_in_the_models_dtype_is_the_float64_average_to_float32_rounding() -> None:
    torch.manual_seed(0)
    model = cnn(1, 8, CLASSES)
    peers = [peer(f"p{i}", perturbed(model, seed=i + 1), "full", 10 * (i + 1)) for i in range(3)]
    wide, narrow = copy.deepcopy(model), copy.deepcopy(model)
    for strategy, target in ((FedAvg(), wide), (FedAvg(sum_dtype="model"), narrow)):
        ctx = context(target, peers=("p0", "p1", "p2"))
        strategy.configure_fetch(ctx)
        for m in peers:
            strategy.fold(ctx, m)
            assert {v.dtype for v in strategy._mean._sum.values()} == ({torch.float32} if target is narrow
                                                                       else {torch.float64})
        strategy.aggregate(ctx, [PeerModel(m.sender, m.part, m.round, m.version, {}, m.meta) for m in peers])
    for k, v in part_state(wide, "full").items():
        torch.testing.assert_close(part_state(narrow, "full")[k], v, rtol=1e-6, atol=1e-6)
    with pytest.raises(ConfigError, match="sum_dtype"):
        build_strategy("fedavg", {"sum_dtype": "float16"})
    with pytest.raises(ConfigError, match="sum_dtype"):
        build_strategy("fedprox", {"sum_dtype": "model", "aggregation": "median"})
    assert build_strategy("fedprox", {"sum_dtype": "model"}).sum_dtype == "model"


@pytest.mark.parametrize("rule", ["median", "trimmed_mean"])
def test_fedavg_robust_rules_take_the_own_model_and_every_peer_at_once(rule: str) -> None:
    from p2pfl.core.robust import robust_aggregate

    torch.manual_seed(0)
    model = cnn(1, 8, CLASSES)
    own = {k: v.clone() for k, v in part_state(model, "full").items()}
    peers = [peer(f"p{i}", perturbed(model, seed=i + 1), "full", 10 * (i + 1)) for i in range(4)]
    strategy = build_strategy("fedprox" if rule == "median" else "fedavg", {"aggregation": rule, "trim": 0.2})
    assert not strategy.folds_arrivals  # a robust rule needs every model of the round at once
    ctx = context(model, peers=tuple(m.sender for m in peers))
    strategy.aggregate(ctx, peers)
    expected = robust_aggregate([own, *(m.tensors for m in peers)], rule, 0.2)
    for k, v in expected.items():
        torch.testing.assert_close(part_state(model, "full")[k], v)
    assert ctx.artefacts.records["aggregated_from"] == ["p0", "p1", "p2", "p3"]
    with pytest.raises(ConfigError, match="aggregation must be one of"):
        build_strategy("fedavg", {"aggregation": "mode"})


@pytest.mark.parametrize("rule", ["krum", "multi_krum", "bulyan"])
def test_fedavg_selection_rules_pick_among_the_own_model_and_the_peers(rule: str) -> None:
    from p2pfl.core.robust import selection_aggregate

    torch.manual_seed(0)
    model = cnn(1, 8, CLASSES)
    own = {k: v.clone() for k, v in part_state(model, "full").items()}
    peers = [peer(f"p{i}", perturbed(model, seed=i + 1), "full", 10) for i in range(6)]
    strategy = build_strategy("fedavg", {"aggregation": rule, "byzantine": 1, "keep": 3})
    assert not strategy.folds_arrivals
    ctx = context(model, peers=tuple(m.sender for m in peers))
    strategy.aggregate(ctx, peers)
    expected, picked = selection_aggregate([own, *(m.tensors for m in peers)], rule, 1, 3 if rule == "multi_krum" else 0)
    for k, v in expected.items():
        torch.testing.assert_close(part_state(model, "full")[k], v)
    names = [ctx.node_id, *(m.sender for m in peers)]
    assert ctx.artefacts.records["picked"] == [names[i] for i in picked]
    # Too few models for the rule (Bulyan with f = 1 needs 7): the own model stays.
    model2 = cnn(1, 8, CLASSES)
    before = {k: v.clone() for k, v in part_state(model2, "full").items()}
    ctx2 = context(model2, peers=("p0", "p1"))
    build_strategy("fedavg", {"aggregation": rule, "byzantine": 1}).aggregate(ctx2, peers[:2])
    assert all(torch.equal(part_state(model2, "full")[k], v) for k, v in before.items())
    assert ctx2.artefacts.records["picked"]["too_few_models"] == 3


@pytest.mark.parametrize("name", ["fedavgm", "fedadam", "fedyogi", "fedadagrad"])
def test_fedopt_steps_from_the_round_start_along_fedavgs_aggregate(name: str) -> None:
    """The pseudo-gradient is FedAvg's aggregate minus the round's start; the moments are the
    strategy's state and survive a checkpoint's JSON-and-tensors form."""
    from p2pfl.core.server_opt import ServerOptimizer
    from p2pfl.runtime.checkpoint import join_strategy_state, split_strategy_state

    torch.manual_seed(0)
    model = cnn(1, 8, CLASSES)
    start = {k: v.clone() for k, v in part_state(model, "full").items()}
    trained = {k: v.clone() for k, v in part_state(perturbed(model, seed=9), "full").items()}
    load_part(model, trained)
    peers = [peer(f"p{i}", perturbed(model, seed=i + 1), "full", 10) for i in range(3)]
    ctx = context(model, peers=tuple(m.sender for m in peers))
    ctx.round_start = start
    fedavg_model = cnn(1, 8, CLASSES)
    load_part(fedavg_model, trained)
    fedavg_ctx = context(fedavg_model, peers=ctx.peers)
    build_strategy("fedavg", {}).aggregate(fedavg_ctx, peers)
    aggregate = part_state(fedavg_model, "full")
    strategy = build_strategy(name, {})
    strategy.aggregate(ctx, peers)
    reference = ServerOptimizer(strategy.kind, strategy.optimizer.lr, strategy.optimizer.beta1,
                                strategy.optimizer.beta2, strategy.optimizer.tau)
    expected = reference.step(start, aggregate)
    for k, v in expected.items():
        torch.testing.assert_close(part_state(model, "full")[k], v)
    plain, tensors = split_strategy_state(strategy.state_dict())
    fresh = build_strategy(name, {})
    fresh.load_state_dict(join_strategy_state(plain, tensors))
    assert all(torch.equal(fresh.optimizer.m[k], strategy.optimizer.m[k]) for k in strategy.optimizer.m)
