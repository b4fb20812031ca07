"""FedC2I driven in-process: hand-built RoundContexts, peers as PeerModels from real models.

The influence batch is the node's whole training split (`influence_batch` larger than it),
so the references below can recompute λ and Λ from the definition, with explicit forward
passes, without knowing which samples the strategy's RNG drew.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from p2pfl.algorithms import build_strategy
from p2pfl.algorithms.fedc2i import FedC2I
from p2pfl.data import NodeData, Split
from p2pfl.errors import ConfigError
from p2pfl.models import SplitModel, cnn, part_state
from p2pfl.runtime.strategy import ArtefactSink, Fetch, PeerModel, RoundContext
from p2pfl.training import LocalTrainer, TrainConfig
from tests.core.test_influence import naive_Lambda, naive_lambda

CLASSES = 3  # naive_Lambda above is written for 3 classes too
N_TRAIN = 48
ALL = 10_000  # an influence batch larger than any split: the whole split


def make_split(n: int, seed: int) -> Split:
    g = torch.Generator().manual_seed(seed)
    protos = torch.randn(CLASSES, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    y = torch.randint(CLASSES, (n,), generator=g)
    return Split(protos[y] + 0.8 * torch.randn(n, 1, 8, 8, generator=g), y)


def make_data(seed: int) -> NodeData:
    return NodeData(0, make_split(N_TRAIN, seed), make_split(20, seed + 1000), make_split(20, seed + 2000), None)


@pytest.fixture(scope="module")
def world() -> dict[str, SplitModel]:
    """Own model and three peers trained briefly from one start (losses stay well above 0,
    where float32 keeps its digits). p1 and p3 learn the node's task; p2 learns it with
    permuted labels, so its weights differ from the others' by a lot and it should count least."""
    torch.manual_seed(0)
    start = cnn(1, 8, CLASSES)
    trainer = LocalTrainer(TrainConfig(epochs=2, batch_size=16, lr=1e-2), seed=0)
    models = {}
    for i, name in enumerate(("me", "p1", "p2", "p3")):
        models[name] = copy.deepcopy(start)
        train = make_data(i).train
        if name == "p2":
            train = Split(train.x, torch.tensor([1, 2, 0])[train.y])
        trainer.fit(models[name], train)
    return models


def peer(sender: str, model: SplitModel, part: str, n_train: int = N_TRAIN, version: int = 1) -> PeerModel:
    return PeerModel(sender, part, version, version, {k: v.clone() for k, v in part_state(model, part).items()},
                     {"n_train": n_train})


def arrivals(world, senders=("p1", "p2"), parts=("body", "head"), n_train: dict[str, int] | None = None) -> list[PeerModel]:
    return [peer(s, world[s], part, (n_train or {}).get(s, N_TRAIN)) for s in senders for part in parts]


def context(world, seed: int = 0) -> RoundContext:
    return RoundContext(
        node_id="me", round=1, rounds=3, peers=("p1", "p2", "p3"), model=copy.deepcopy(world["me"]),
        data=make_data(0), trainer=LocalTrainer(TrainConfig(epochs=1, batch_size=16)),
        rng=np.random.default_rng(seed), artefacts=ArtefactSink("me", None), log=lambda _: None,
    )


def saved(ctx: RoundContext, name: str) -> dict | None:
    found = [e["value"] for e in ctx.artefacts.saved if e["name"] == name]
    return found[-1] if found else None


def references(world, ctx: RoundContext, senders=("p1", "p2"), gamma: float = 5.0):
    models = [world["me"]] + [world[s] for s in senders]
    x, y = ctx.data.train.x, ctx.data.train.y
    return models, naive_lambda(models, x, y, gamma)[1], naive_Lambda(models, x, y, gamma)[1]


def weighted(models: list[SplitModel], part: str, weights) -> dict[str, torch.Tensor]:
    states = [part_state(m, part) for m in models]
    return {k: sum(float(w) * s[k].double() for w, s in zip(weights, states)) for k in states[0]}


def expected_head(models: list[SplitModel], Lam: list[list[float]]) -> dict[str, torch.Tensor]:
    heads = [part_state(m, "head") for m in models]
    w = torch.stack([sum(Lam[i][c] * heads[i]["head.weight"][c].double() for i in range(len(models)))
                     for c in range(CLASSES)])
    b = torch.tensor([sum(Lam[i][c] * float(heads[i]["head.bias"][c]) for i in range(len(models))) for c in range(CLASSES)],
                     dtype=torch.float64)
    return {"head.weight": w, "head.bias": b}


def assert_part(model: SplitModel, part: str, expected: dict[str, torch.Tensor], atol: float = 1e-6) -> None:
    got = part_state(model, part)
    assert set(got) == set(expected)
    for k, v in expected.items():
        assert torch.allclose(got[k].double(), v.double(), atol=atol), k


def test_fetches_body_and_head_from_every_peer(world):
    ctx = context(world)
    strategy = FedC2I()
    assert strategy.shared_parts == ("body", "head")
    assert set(strategy.configure_fetch(ctx)) == {Fetch(p, part) for p in ctx.peers for part in ("body", "head")}
    local = FedC2I(variant="Lambda/l")  # uses no peer body: neither shares nor fetches one
    assert local.shared_parts == ("head",)
    assert set(local.configure_fetch(ctx)) == {Fetch(p, "head") for p in ctx.peers}


def test_full_body_is_lambda_weighted_and_head_rows_are_Lambda_weighted(world):
    ctx = context(world)
    strategy = FedC2I(gamma=5.0, influence_batch=ALL)
    strategy.aggregate(ctx, arrivals(world))
    models, lam, Lam = references(world, ctx)
    lam_saved, Lam_saved = saved(ctx, "lambda"), saved(ctx, "Lambda")
    assert lam_saved["peers"] == Lam_saved["peers"] == ["me", "p1", "p2"]
    assert lam_saved["values"] == pytest.approx(lam, rel=1e-4)
    assert np.allclose(Lam_saved["values"], Lam, rtol=1e-4)
    assert ctx.artefacts.records["lambda_self"] == pytest.approx(lam[0], rel=1e-4)
    assert ctx.artefacts.records["Lambda_self"] == pytest.approx(np.mean(Lam[0]), rel=1e-4)
    assert ctx.artefacts.records["aggregated_from"] == ["p1", "p2"]
    assert_part(ctx.model, "body", weighted(models, "body", lam))
    assert_part(ctx.model, "head", expected_head(models, Lam))
    # The peer with permuted labels counts least, and the weights are far enough from
    # uniform that the checks above tell them apart from a plain average.
    assert lam[2] < min(lam[0], lam[1])
    assert strategy.peer_scores(ctx) == pytest.approx({"p1": lam[1], "p2": lam[2]}, rel=1e-4)  # its trust: λ
    uniform = weighted(models, "body", [1 / 3] * 3)
    assert max(float((part_state(ctx.model, "body")[k].double() - v).abs().max()) for k, v in uniform.items()) > 1e-3
    uniform = weighted(models, "head", [1 / 3] * 3)
    assert max(float((part_state(ctx.model, "head")[k].double() - v).abs().max()) for k, v in uniform.items()) > 1e-3


def test_only_peers_with_both_parts_take_part(world):
    ctx = context(world)
    arrived = arrivals(world) + [peer("p3", world["p3"], "body")]  # p3's head did not arrive
    FedC2I(influence_batch=ALL).aggregate(ctx, arrived)
    models, lam, Lam = references(world, ctx)
    assert saved(ctx, "lambda")["peers"] == ["me", "p1", "p2"]
    assert_part(ctx.model, "body", weighted(models, "body", lam))


def test_newest_version_of_a_part_is_used(world):
    ctx = context(world)
    old = peer("p1", world["p3"], "body", version=0)  # an older p1 body that must be ignored
    FedC2I(influence_batch=ALL).aggregate(ctx, [old] + arrivals(world))
    models, lam, _ = references(world, ctx)
    assert_part(ctx.model, "body", weighted(models, "body", lam))


def test_lambda_local_keeps_the_own_body_exactly(world):
    ctx = context(world)
    FedC2I(influence_batch=ALL, variant="Lambda/l").aggregate(ctx, arrivals(world, parts=("head",)))
    models, _, Lam = references(world, ctx)
    for k, v in part_state(world["me"], "body").items():
        assert torch.equal(part_state(ctx.model, "body")[k], v)
    assert_part(ctx.model, "head", expected_head(models, Lam))
    assert saved(ctx, "lambda") is None and "lambda_self" not in ctx.artefacts.records
    assert np.allclose(saved(ctx, "Lambda")["values"], Lam, rtol=1e-4)


def test_lambda_global_averages_the_body_by_sample_count(world):
    ctx = context(world)
    counts = {"p1": 10, "p2": 200}
    FedC2I(influence_batch=ALL, variant="Lambda/g").aggregate(ctx, arrivals(world, n_train=counts))
    models, _, Lam = references(world, ctx)
    n = np.array([N_TRAIN, counts["p1"], counts["p2"]], dtype=float)
    assert_part(ctx.model, "body", weighted(models, "body", n / n.sum()))
    assert_part(ctx.model, "head", expected_head(models, Lam))
    assert saved(ctx, "lambda") is None


def test_minus_lambda_uses_lambda_for_the_whole_model(world):
    ctx = context(world)
    FedC2I(influence_batch=ALL, variant="-lambda").aggregate(ctx, arrivals(world))
    models, lam, _ = references(world, ctx)
    assert_part(ctx.model, "body", weighted(models, "body", lam))
    assert_part(ctx.model, "head", weighted(models, "head", lam))
    assert saved(ctx, "Lambda") is None
    assert saved(ctx, "lambda")["values"] == pytest.approx(lam, rel=1e-4)


@pytest.mark.parametrize("variant", ["full", "-lambda", "Lambda/l", "Lambda/g"])
def test_no_peer_keeps_the_own_model_with_weight_one(world, variant):
    ctx = context(world)
    FedC2I(variant=variant).aggregate(ctx, [])
    for k, v in world["me"].state_dict().items():
        assert torch.equal(ctx.model.state_dict()[k], v)
    if variant in ("full", "-lambda"):
        assert saved(ctx, "lambda") == {"peers": ["me"], "values": [1.0], "losses": None}
        assert ctx.artefacts.records["lambda_self"] == 1.0
    if variant != "-lambda":
        assert saved(ctx, "Lambda")["values"] == [[1.0] * CLASSES]


def test_influence_chunk_changes_nothing_but_the_schedule(world):
    a, b = context(world), context(world)
    FedC2I(influence_batch=ALL).aggregate(a, arrivals(world))
    FedC2I(influence_batch=ALL, influence_chunk=1).aggregate(b, arrivals(world))
    assert saved(b, "lambda")["values"] == pytest.approx(saved(a, "lambda")["values"], rel=1e-6)
    for k, v in a.model.state_dict().items():
        assert torch.allclose(b.model.state_dict()[k], v, atol=1e-7)


def test_gamma_zero_is_the_uniform_average(world):
    ctx = context(world)
    FedC2I(gamma=0, influence_batch=ALL).aggregate(ctx, arrivals(world))
    models = [world[s] for s in ("me", "p1", "p2")]
    assert_part(ctx.model, "body", weighted(models, "body", [1 / 3] * 3))
    assert_part(ctx.model, "head", weighted(models, "head", [1 / 3] * 3))


def test_influence_batch_is_drawn_from_the_train_split_with_the_node_rng(world):
    strategy = FedC2I(influence_batch=8)
    a, b, c = context(world, seed=1), context(world, seed=1), context(world, seed=2)
    xa, ya = strategy.draw_batch(a)
    xb, _ = strategy.draw_batch(b)
    xc, _ = strategy.draw_batch(c)
    assert xa.shape[0] == 8 and torch.equal(xa, xb) and not torch.equal(xa, xc)
    rows = {tuple(r.flatten().tolist()) for r in a.data.train.x}
    assert all(tuple(r.flatten().tolist()) in rows for r in xa)
    assert len({tuple(r.flatten().tolist()) for r in xa}) == 8  # without replacement
    assert strategy.draw_batch(context(world))[0].shape[0] == 8
    assert FedC2I(influence_batch=ALL).draw_batch(a)[0].shape[0] == N_TRAIN


def test_a_broken_peer_leaves_the_own_model_and_is_reported(world):
    ctx = context(world)
    broken = peer("p2", world["p2"], "head")
    broken.tensors["head.weight"].fill_(float("inf"))
    arrived = [peer("p1", world["p1"], "body"), peer("p1", world["p1"], "head"),
               peer("p2", world["p2"], "body"), broken]
    FedC2I(influence_batch=ALL).aggregate(ctx, arrived)
    assert "non-finite" in ctx.artefacts.records["influence_error"]
    for k, v in world["me"].state_dict().items():
        assert torch.equal(ctx.model.state_dict()[k], v)


@pytest.mark.parametrize("params, bad", [
    ({"variant": "Lambda"}, "'Lambda'"),
    ({"gamma": -1.0}, "-1.0"),
    ({"gamma": float("nan")}, "nan"),
    ({"influence_batch": 0}, "0"),
    ({"influence_batch": 2.5}, "2.5"),
    ({"influence_chunk": 0}, "0"),
])
def test_bad_parameters_are_config_errors_naming_the_value(params, bad):
    with pytest.raises(ConfigError, match="algorithm.params") as info:
        build_strategy("fedc2i", params)
    assert bad in str(info.value)


def test_registered_with_its_parameters():
    strategy = build_strategy("fedc2i", {"gamma": 2, "variant": "Lambda/g", "influence_batch": 32})
    assert isinstance(strategy, FedC2I)
    assert (strategy.gamma, strategy.variant, strategy.influence_batch) == (2.0, "Lambda/g", 32)
    with pytest.raises(ConfigError, match="algorithm.params.beta"):
        build_strategy("fedc2i", {"beta": 1})


@pytest.mark.parametrize("variant", ["full", "-lambda", "Lambda/g"])
def test_auto_gamma_keeps_the_grid_gamma_whose_aggregate_scores_best_on_validation(world, variant):
    """Brute force: aggregate with each γ of the grid separately, score each on the validation
    split; "auto" must end with the best one's model and record its γ."""
    grid = [0.5, 2.0, 10.0]
    scores, models = {}, {}
    for gamma in grid:
        ctx = context(world)
        FedC2I(gamma=gamma, influence_batch=ALL, variant=variant).aggregate(ctx, arrivals(world))
        acc, loss = ctx.trainer.evaluate(ctx.model, ctx.data.val)
        scores[gamma], models[gamma] = (acc, -loss), ctx.model
    best = max(grid, key=lambda g: scores[g])
    ctx = context(world)
    FedC2I(gamma="auto", gamma_grid=grid, influence_batch=ALL, variant=variant).aggregate(ctx, arrivals(world))
    assert ctx.artefacts.records["gamma"] == best
    for k, v in models[best].state_dict().items():
        assert torch.allclose(ctx.model.state_dict()[k], v, atol=1e-6), k
    assert len({scores[g] for g in grid}) > 1  # the grid really offers different aggregates


def test_auto_gamma_is_validated_and_the_grid_needs_it():
    assert build_strategy("fedc2i", {"gamma": "auto"}).gamma_grid == (0.5, 1.0, 2.0, 5.0, 10.0)
    with pytest.raises(ConfigError, match="gamma_grid"):
        build_strategy("fedc2i", {"gamma": 2, "gamma_grid": [1, 2]})
    with pytest.raises(ConfigError, match="gamma_grid"):
        build_strategy("fedc2i", {"gamma": "auto", "gamma_grid": []})
    with pytest.raises(ConfigError, match="'often'"):
        build_strategy("fedc2i", {"gamma": "often"})
