"""DI, GA and coordinator FedAvg driven in-process: hand-built RoundContexts, pure aggregators."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from p2pfl.algorithms import build_strategy
from p2pfl.algorithms.di import DI, STATS_KEYS
from p2pfl.models import body_features
from p2pfl.algorithms import build_coordinator_half
from p2pfl.algorithms.global_model import DIHalf, FedAvgGlobalHalf, GAHalf
from p2pfl.core.dia import dia_weights, influence_distribution
from p2pfl.errors import ConfigError
from p2pfl.models import cnn, load_part, part_state
from p2pfl.runtime.coordinator_half import CoordinatorEnv, Reply, Submission
from p2pfl.runtime.strategy import COORDINATOR_ID, ArtefactSink, Fetch, PeerModel, RoundContext
from p2pfl.training import LocalTrainer, TrainConfig

CLASSES = 3


@dataclass
class Split:
    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)


@dataclass
class Data:
    train: Split
    val: Split
    test: Split


def make_split(n: int, seed: int, shuffle_labels: bool = False) -> Split:
    """Class-c images are a fixed prototype c plus noise; `shuffle_labels` breaks the link."""
    protos = torch.randn(CLASSES, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(CLASSES, (n,), generator=g)
    x = protos[y] + 0.6 * torch.randn(n, 1, 8, 8, generator=g)
    if shuffle_labels:
        y = y[torch.randperm(n, generator=g)]
    return Split(x, y)


def make_data(seed: int, n_train: int = 96, shuffle_labels: bool = False) -> Data:
    return Data(make_split(n_train, seed, shuffle_labels), make_split(48, seed + 1000), make_split(24, seed + 2000))


def initial_state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return part_state(cnn(1, 8, CLASSES), "full")


def make_ctx(node: str, data: Data, round_: int = 1, seed: int = 0) -> RoundContext:
    model = cnn(1, 8, CLASSES)
    load_part(model, initial_state())
    return RoundContext(
        node_id=node, round=round_, rounds=3, peers=(), model=model, data=data,
        trainer=LocalTrainer(TrainConfig(epochs=1, batch_size=16), seed=seed),
        rng=np.random.default_rng(seed), artefacts=ArtefactSink(node, None), log=lambda _: None,
        coordinator=COORDINATOR_ID,
    )


def run_round(strategy, ctx: RoundContext) -> Submission:
    """fit -> pushes, as the runtime does; returns what the coordinator would receive."""
    ctx.artefacts.begin_round(ctx.round)
    strategy.fit(ctx)
    (push,) = strategy.pushes(ctx)
    assert push.target == COORDINATOR_ID and push.kind == "stats"
    return Submission(ctx.node_id, dict(push.tensors), dict(push.meta))


def global_from(update: Reply, round_: int) -> PeerModel:
    return PeerModel(COORDINATOR_ID, "global", round_, round_, update.parts["global"], dict(update.meta))


def env(rounds: int = 3) -> CoordinatorEnv:
    return CoordinatorEnv(model=cnn(1, 8, CLASSES), rounds=rounds, seed=0, num_classes=CLASSES, nodes=())


def weights(update: Reply) -> dict[str, float]:
    return update.meta["weights"]


# ---- registry and node side -------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["fedavg_global", "ga", "di"])
def test_registered_with_coordinator(name: str) -> None:
    strategy = build_strategy(name)
    assert strategy.needs_coordinator and strategy.shared_parts == ()
    assert strategy.configure_fetch(make_ctx("n0", make_data(1))) == [Fetch(COORDINATOR_ID, "global")]


@pytest.mark.parametrize("name,params", [
    ("di", {"solver": "newton"}), ("di", {"hessian": "body"}), ("di", {"xi_mapping": "quotient"}),
    ("di", {"alpha": 0.0}), ("di", {"core_size": 0}), ("di", {"nope": 1}), ("ga", {"fair_metric": "f1"}),
])
def test_bad_params_fail_early(name: str, params: dict) -> None:
    with pytest.raises(ConfigError):
        build_strategy(name, params)


@pytest.mark.parametrize("params", [
    {}, {"hessian": "all", "cg_iterations": 3}, {"solver": "lissa", "lissa_depth": 20, "hvp_samples": 32},
    {"hvp_samples": 40}, {"dic": False},
])
def test_di_push_carries_finite_stats_and_full_state(params: dict) -> None:
    ctx = make_ctx("n0", make_data(1))
    strategy = build_strategy("di", params)
    sub = run_round(strategy, ctx)
    assert set(sub.meta) == set(STATS_KEYS)
    assert sub.meta["n_train"] == 96
    assert math.isfinite(sub.meta["phi"]) and sub.meta["phi"] > 0
    if params.get("dic", True):
        assert math.isfinite(sub.meta["xi"])
        assert ctx.artefacts.records["dic"]["iterations"] >= 1
    else:
        assert sub.meta["xi"] is None
    assert ctx.artefacts.records["xi"] == sub.meta["xi"] and ctx.artefacts.records["phi"] == sub.meta["phi"]
    state = part_state(ctx.model, "full")
    assert set(sub.state) == set(state)
    assert all(torch.equal(sub.state[k], state[k]) for k in state)
    assert not torch.equal(sub.state["head.weight"], initial_state()["head.weight"])  # trained
    assert sub.meta["val_loss_prev_local"] is None and sub.meta["start_is_global"] is True


def test_xi_matches_the_closed_form_at_global_and_local_params() -> None:
    """Head-only ξ = −ḡᵀ(H + λI)⁻¹g_core, with g_core at the START (global) params."""
    data = make_data(3)
    ctx = make_ctx("n0", data, seed=5)
    start = {k: v.clone() for k, v in part_state(ctx.model, "full").items()}
    strategy = DI(core_size=20, damping=0.05, cg_iterations=500)
    sub = run_round(strategy, ctx)
    core_idx = torch.as_tensor(np.random.default_rng(5).choice(96, size=20, replace=False))  # the strategy's first draw
    local = part_state(ctx.model, "full")

    def head_loss(flat: torch.Tensor, feats: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        w, b = flat[: 64 * CLASSES].view(CLASSES, 64), flat[64 * CLASSES :]
        return torch.nn.functional.cross_entropy(feats @ w.T + b, y)

    def flat_head(state: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([state["head.weight"].reshape(-1), state["head.bias"]]).double()

    f_core = body_features(ctx.model, data.train.x[core_idx], start).double()
    f_train = body_features(ctx.model, data.train.x, local).double()
    y = data.train.y
    g_core = torch.func.grad(head_loss)(flat_head(start), f_core, y[core_idx])
    g_train = torch.func.grad(head_loss)(flat_head(local), f_train, y)
    h = torch.autograd.functional.hessian(lambda p: head_loss(p, f_train, y), flat_head(local))
    expected = -float(g_train @ torch.linalg.solve(h + 0.05 * torch.eye(len(h), dtype=h.dtype), g_core))
    assert sub.meta["xi"] == pytest.approx(expected, rel=2e-3, abs=1e-7)


def test_aggregate_loads_the_global_model_or_keeps_the_local_one() -> None:
    ctx = make_ctx("n0", make_data(1))
    strategy = build_strategy("di")
    run_round(strategy, ctx)
    local = part_state(ctx.model, "full")
    glob = {k: torch.full_like(v, 0.5) for k, v in local.items()}
    strategy.aggregate(ctx, [PeerModel(COORDINATOR_ID, "global", 1, 1, glob, {"weights": {"n0": 1.0}})])
    assert all(torch.equal(ctx.model.state_dict()[k], glob[k]) for k in glob)
    assert ctx.artefacts.records["global_received"] is True and ctx.artefacts.records["global_weight"] == 1.0

    ctx.round = 2
    sub = run_round(strategy, ctx)
    assert sub.meta["start_is_global"] is True and sub.meta["val_loss_prev_local"] is not None
    local = part_state(ctx.model, "full")
    strategy.aggregate(ctx, [])  # coordinator unreachable
    assert all(torch.equal(ctx.model.state_dict()[k], local[k]) for k in local)
    assert ctx.artefacts.records["global_received"] is False
    ctx.round = 3
    assert run_round(strategy, ctx).meta["start_is_global"] is False  # GA must not read a gap from this round


# ---- aggregators ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def round_one() -> list[Submission]:
    """Round 1 of DI for a good node, a good node with less data, and a node with shuffled labels."""
    specs = [("good", make_data(1)), ("small", make_data(2, n_train=48)), ("shuffled", make_data(3, shuffle_labels=True))]
    return [run_round(build_strategy("di"), make_ctx(node, data, seed=i)) for i, (node, data) in enumerate(specs)]


def test_fedavg_global_weights_follow_n_train(round_one: list[Submission]) -> None:
    update = FedAvgGlobalHalf(env()).aggregate(1, round_one)
    assert weights(update) == pytest.approx({"good": 0.4, "small": 0.2, "shuffled": 0.4})
    expected = sum(w * s.state["head.bias"] for w, s in zip([0.4, 0.2, 0.4], round_one))
    torch.testing.assert_close(update.model["head.bias"], expected)


def test_di_weights_match_dia(round_one: list[Submission]) -> None:
    xi = [s.meta["xi"] for s in round_one]
    phi = [s.meta["phi"] for s in round_one]
    update = DIHalf(env(), alpha=0.8, beta=2.0).aggregate(1, round_one)
    expected = dia_weights(xi, phi, alpha=0.8, beta=2.0)
    assert [weights(update)[s.node_id] for s in round_one] == pytest.approx(expected.tolist())
    assert update.info["ablation"] == "full" and update.info["xi"]["good"] == xi[0]
    # ... and the global state is the ω-weighted average
    torch.testing.assert_close(update.model["head.bias"], sum(w * s.state["head.bias"] for w, s in zip(expected, round_one)))


def test_what_dia_says_about_shuffled_labels(round_one: list[Submission]) -> None:
    """Both DIA terms give a node with shuffled labels less weight than a clean one.

    A node with shuffled labels cannot fit them, so its training-loss sum φ is the largest
    and its w2 the smallest. ξ = −ḡᵀ(H + λI)⁻¹g_core is most negative for a node whose
    training gradient at the local model still aligns with its core gradient at the global
    model (consistent data, not yet fitted); shuffled labels give small, incoherent gradients
    and ξ near 0. Eq. 12's ξ/Σξ with all ξ negative gives the most negative ξ the largest share,
    so the ξ term agrees with the φ term. (Our order-preserving "shift" reads ξ the other way
    round and rewards the shuffled node: kept as an option, asserted below so that it is noticed.)
    """
    good, _, shuffled = round_one
    assert shuffled.meta["phi"] > good.meta["phi"]
    phi_only = weights(DIHalf(env(), alpha=math.inf, beta=1.0).aggregate(1, round_one))
    assert phi_only["shuffled"] < phi_only["good"]
    assert good.meta["xi"] < shuffled.meta["xi"] < 0
    xi_only = weights(DIHalf(env(), dia=False).aggregate(1, round_one))
    assert xi_only["shuffled"] < xi_only["good"]
    full = weights(DIHalf(env()).aggregate(1, round_one))
    assert full["shuffled"] < full["good"]
    shift = weights(DIHalf(env(), xi_mapping="shift").aggregate(1, round_one))
    assert shift["shuffled"] > shift["good"]


def test_xi_is_minus_a_newton_decrement_without_training() -> None:
    """No training and the core = the whole training set: ξ = −gᵀ(H + λI)⁻¹g < 0 (H + λI ≻ 0)."""
    ctx = make_ctx("n0", make_data(4))
    ctx.trainer = LocalTrainer(TrainConfig(epochs=0))
    sub = run_round(DI(core_size=10_000, cg_iterations=200), ctx)
    assert sub.meta["xi"] < 0


def test_di_ablations(round_one: list[Submission]) -> None:
    xi = [s.meta["xi"] for s in round_one]
    phi = [s.meta["phi"] for s in round_one]
    ids = [s.node_id for s in round_one]
    none = weights(DIHalf(env(), dic=False, dia=False).aggregate(1, round_one))
    assert none == pytest.approx(weights(FedAvgGlobalHalf(env()).aggregate(1, round_one)))
    dic_only = weights(DIHalf(env(), dic=True, dia=False).aggregate(1, round_one))
    assert [dic_only[i] for i in ids] == pytest.approx(influence_distribution(xi).tolist())
    dia_only = DIHalf(env(), dic=False, dia=True, alpha=0.1).aggregate(1, round_one)
    assert [weights(dia_only)[i] for i in ids] == pytest.approx(dia_weights(None, phi, alpha=0.1).tolist())
    assert dia_only.info["w1"] == pytest.approx([1 / 3] * 3)


def test_non_finite_states_and_missing_stats(round_one: list[Submission]) -> None:
    good, small, shuffled = round_one
    broken = Submission("broken", {k: torch.full_like(v, math.nan) for k, v in good.state.items()}, dict(good.meta))
    no_xi = Submission("small", small.state, {**small.meta, "xi": None, "phi": float("inf")})
    update = DIHalf(env()).aggregate(1, [good, no_xi, shuffled, broken])
    assert weights(update)["broken"] == 0.0 and update.info["dropped_non_finite"] == ["broken"]
    assert update.info["imputed"] == {"xi": ["small"], "phi": ["small"]}
    assert all(torch.isfinite(v).all() for v in update.model.values())
    assert sum(weights(update).values()) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        DIHalf(env()).aggregate(1, [broken])


def ga_submission(node: str, state: dict[str, torch.Tensor], start: float | None, prev: float | None) -> Submission:
    meta = {"n_train": 10, "start_is_global": True, "val_loss_start": start, "val_loss_prev_local": prev}
    return Submission(node, state, meta)


def test_ga_moves_weight_toward_the_larger_gap() -> None:
    state = initial_state()
    agg = GAHalf(env(rounds=10))
    first = agg.aggregate(1, [ga_submission(n, state, 1.0, None) for n in "abc"])
    assert weights(first) == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})  # no gap in round 1
    gaps = {"a": 0.9, "b": 0.1, "c": 0.2}  # global loss − previous local loss on each node's val split
    second = agg.aggregate(2, [ga_submission(n, state, 1.0 + g, 1.0) for n, g in gaps.items()])
    w = weights(second)
    assert w["a"] > 1 / 3 > w["c"] > w["b"]
    assert second.info["step"] == pytest.approx(0.2 / 3)  # the first update, made after round 1, uses d/n
    assert all(0 <= v <= 1 for v in w.values()) and sum(w.values()) == pytest.approx(1.0)
    third = agg.aggregate(3, [ga_submission(n, state, 1.0 + g, 1.0) for n, g in gaps.items()])
    assert weights(third)["a"] > w["a"]  # the state persists and keeps moving
    assert third.info["step"] == pytest.approx(0.2 / 3 * (1 - 1 / 10))  # linear decay
    # a node without a gap (did not get the global model) is not moved
    subs = [ga_submission(n, state, 1.0 + g, 1.0) for n, g in gaps.items()]
    subs[2] = Submission("c", state, {**subs[2].meta, "start_is_global": False})
    before = dict(agg.current)
    fourth = agg.aggregate(4, subs)
    assert fourth.info["gaps"]["c"] is None
    assert weights(fourth)["a"] > before["a"] and weights(fourth)["b"] < before["b"]


def test_ga_end_to_end_from_node_stats() -> None:
    """Two nodes through two rounds; the gap comes from the nodes' own validation losses."""
    agg = build_coordinator_half("ga", {}, env(rounds=5))
    nodes = {"a": make_data(1), "b": make_data(2, shuffle_labels=True)}
    strategies = {n: build_strategy("ga") for n in nodes}
    ctxs = {n: make_ctx(n, d, seed=i) for i, (n, d) in enumerate(nodes.items())}
    for r in (1, 2):
        subs = []
        for n in nodes:
            ctxs[n].round = r
            subs.append(run_round(strategies[n], ctxs[n]))
        update = agg.aggregate(r, subs)
        for n in nodes:
            strategies[n].aggregate(ctxs[n], [global_from(update, r)])
    gaps = update.info["gaps"]
    assert gaps["a"] is not None and gaps["b"] is not None
    larger = max(gaps, key=gaps.get)
    assert weights(update)[larger] > 0.5
    assert all(torch.equal(ctxs["a"].model.state_dict()[k], update.model[k]) for k in update.model)


def test_one_registration_splits_the_parameters_between_the_halves() -> None:
    di = build_coordinator_half("di", {"alpha": 0.5, "core_size": 10, "damping": 0.1, "dia": False, "dic": False}, env())
    assert isinstance(di, DIHalf) and di.alpha == 0.5 and not di.dia and not di.dic
    node = build_strategy("di", {"alpha": 0.5, "core_size": 10, "dic": False})
    assert node.core_size == 10 and not node.dic  # `dic` is read by both halves
    assert isinstance(build_coordinator_half("fedavg_global", {}, env()), FedAvgGlobalHalf)
    with pytest.raises(ConfigError, match="algorithm.params.step"):
        build_strategy("ga", {"step": 0.1})
    with pytest.raises(ConfigError, match="unknown GA metric"):
        build_strategy("ga", {"fair_metric": "f1"})  # a coordinator parameter, checked when the scenario loads
    with pytest.raises(ConfigError, match="no coordinator half"):
        build_coordinator_half("fedavg", {}, env())


def _stats_only(node: str, xi: float | None, phi: float = 1.0) -> Submission:
    model = cnn(1, 8, CLASSES)
    return Submission(node, {k: v.detach().clone() for k, v in model.state_dict().items()},
                      {"xi": xi, "phi": phi, "n_train": 100})


@pytest.mark.parametrize("mapping", ["ratio", "shift", "rank", "softmax"])
@pytest.mark.parametrize("dia", [False, True])
def test_a_node_without_xi_gets_the_smallest_share(mapping: str, dia: bool) -> None:
    """The issue's example: ξ = [missing, −0.15, −0.30]. Imputing min(ξ) gave the missing node the
    largest share under the ratio (DIC alone [0.4, 0.2, 0.4]); it must get the smallest under every
    mapping, and 0 of the ξ term."""
    subs = [_stats_only("silent", None), _stats_only("a", -0.15), _stats_only("b", -0.30)]
    update = DIHalf(env(), dia=dia, xi_mapping=mapping).aggregate(1, subs)
    w = weights(update)
    assert w["silent"] <= min(w["a"], w["b"]) and w["silent"] < max(w["a"], w["b"])  # "shift" gives b 0 too
    assert update.info["imputed"]["xi"] == ["silent"]
    if not dia:  # DIC alone: ω is ξ' itself
        assert w["silent"] == 0.0
        assert [w["a"], w["b"]] == pytest.approx(influence_distribution([-0.15, -0.30], mapping).tolist())
    if mapping == "ratio" and not dia:
        assert [w["a"], w["b"]] == pytest.approx([1 / 3, 2 / 3])  # the most negative ξ weighs most, as printed
