"""Client2Vec's node half in-process: eq. 4 off is plain training, the three switches, validation."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from p2pfl.algorithms import build_strategy, needs_coordinator
from p2pfl.algorithms.client2vec import Client2Vec
from p2pfl.scenario.run_inputs import resolve_run_inputs
from p2pfl.core.client2vec import ClientIndex, aggregation_weights, cohort_similarity, exclusion_window
from p2pfl.errors import ConfigError
from p2pfl.models import cnn, part_state
from p2pfl.runtime.strategy import ArtefactSink, PeerModel, RoundContext

from .test_di import CLASSES, make_data

PEERS = tuple(f"node-{i}" for i in range(1, 10))


def make_ctx(round_: int = 1, seed: int = 0) -> RoundContext:
    from p2pfl.training import LocalTrainer, TrainConfig

    torch.manual_seed(0)
    return RoundContext(
        node_id="node-0", round=round_, rounds=5, peers=PEERS, model=cnn(1, 8, CLASSES), data=make_data(1),
        trainer=LocalTrainer(TrainConfig(epochs=1, batch_size=16), seed=seed), rng=np.random.default_rng(seed),
        artefacts=ArtefactSink("node-0", None), log=lambda _: None, seed=3,
    )


def with_indices(strategy: Client2Vec, dim: int = 16) -> Client2Vec:
    g = torch.Generator().manual_seed(1)
    for i, node in enumerate(("node-0",) + PEERS):
        strategy.indices[node] = ClientIndex(torch.randn(dim, generator=g), torch.rand(dim, generator=g))
        strategy.n_train[node] = 50 + 10 * i
    return strategy


def test_mu_zero_and_local_off_train_exactly_as_without_eq4() -> None:
    plain = make_ctx()
    plain.trainer.fit(plain.model, plain.data.train)
    for params in ({"mu": 0.0}, {"local": False}):
        ctx = make_ctx()
        with_indices(build_strategy("client2vec", params)).fit(ctx)
        for key, value in part_state(plain.model, "full").items():
            assert torch.equal(value, part_state(ctx.model, "full")[key]), (params, key)


def test_eq4_changes_training_and_keeps_its_parts_local() -> None:
    plain = make_ctx()
    plain.trainer.fit(plain.model, plain.data.train)
    ctx = make_ctx()
    strategy = with_indices(build_strategy("client2vec", {"mu": 5.0}))
    strategy.fit(ctx)
    assert set(part_state(ctx.model, "full")) == set(part_state(plain.model, "full"))  # P is not shared
    assert any(not torch.equal(v, part_state(ctx.model, "full")[k]) for k, v in part_state(plain.model, "full").items())
    record = ctx.artefacts.records["eq4"]
    assert record["mu"] == 5.0 and record["orth"] >= 0 and record["distill"] >= 0
    fixed = with_indices(build_strategy("client2vec", {"projection": "fixed"}))
    before = None
    for _ in range(2):
        fixed.fit(make_ctx())
        now = fixed._eq4.projection.detach().clone()
        assert before is None or torch.equal(before, now)
        before = now


def test_sampling_uses_eq1_over_the_previous_cohort_with_the_exclusion_window() -> None:
    strategy = with_indices(build_strategy("client2vec", {"fraction": 0.2, "tau": 0.5}))
    ctx = make_ctx(round_=1)
    first = strategy.configure_fetch(ctx)
    k = math.ceil(0.2 * len(PEERS))
    assert len(first) == k and "sampling_probabilities" not in ctx.artefacts.records  # round 1: uniform
    strategy.last_cohort = [f.peer for f in first]
    ctx2 = make_ctx(round_=2)
    second = strategy.configure_fetch(ctx2)
    probs = ctx2.artefacts.records["sampling_probabilities"]
    assert sum(probs.values()) == pytest.approx(1.0) and len(second) == k
    assert exclusion_window(len(PEERS), k) == 2  # floor(9 / 4)
    for f in first:
        assert probs[f.peer] == 0.0  # drawn last round: inside the window
    cohort = ["node-0", *strategy.last_cohort]
    open_ = [p for p in PEERS if probs[p] > 0]
    logits = {p: cohort_similarity(strategy.indices, strategy.n_train, cohort, p) / 0.5 for p in open_}
    z = sum(math.exp(v) for v in logits.values())
    for p in open_:
        assert probs[p] == pytest.approx(math.exp(logits[p]) / z)


def test_aggregation_weights_are_eq3_and_the_fedavg_row_is_sample_weighted() -> None:
    strategy = with_indices(build_strategy("client2vec", {"gamma": 0.5, "heat": 2.0}))
    ctx = make_ctx()
    torch.manual_seed(5)
    others = {p: part_state(cnn(1, 8, CLASSES), "full") for p in ("node-3", "node-7")}
    arrived = [PeerModel(p, "full", 1, 1, {k: v.clone() for k, v in s.items()}, {"n_train": strategy.n_train[p]})
               for p, s in others.items()]
    own = {k: v.clone() for k, v in part_state(ctx.model, "full").items()}
    strategy.aggregate(ctx, arrived)
    cohort = ["node-0", "node-3", "node-7"]
    history = {i: cohort_similarity(strategy.indices, strategy.n_train, cohort, i) for i in strategy.indices}
    sizes = {"node-0": float(len(ctx.data.train)), "node-3": 80.0, "node-7": 120.0}
    total = sum(sizes.values())
    expected = aggregation_weights(history, {c: sizes[c] / total for c in cohort}, 2.0)
    assert ctx.artefacts.records["weights"] == pytest.approx(expected)
    key = "head.bias"
    mixed = expected["node-0"] * own[key] + sum(expected[p] * others[p][key] for p in others)
    torch.testing.assert_close(part_state(ctx.model, "full")[key], mixed)
    plain = with_indices(build_strategy("client2vec", {"aggregation": False}))
    ctx2 = make_ctx()
    plain.aggregate(ctx2, copy.deepcopy(arrived))
    assert ctx2.artefacts.records["weights"] == pytest.approx({c: sizes[c] / total for c in cohort})


def test_parameters_and_conflicts_are_refused_with_the_field() -> None:
    assert needs_coordinator("client2vec", {}) and not needs_coordinator("client2vec", {"index": "mean_embedding"})
    with pytest.raises(ConfigError, match="algorithm.params.sampler"):
        build_strategy("client2vec", {"sampler": True})
    with pytest.raises(ConfigError, match="strategy must be one of"):
        build_strategy("client2vec", {"strategy": "central"})
    assert not needs_coordinator("client2vec", {"strategy": "federated"})
    assert build_strategy("client2vec", {"strategy": "federated"}).mu == 1.0  # the paper's weight for it
    with pytest.raises(ConfigError, match="orth"):
        build_strategy("client2vec", {"orth": "l2"})
    with pytest.raises(ConfigError, match="local_orth must be one of"):
        build_strategy("client2vec", {"local_orth": "l2"})
    assert "exact labels" in build_strategy("client2vec", {}).privacy_conflict("dp-sgd")
    assert "DSA-IGN weights" in build_strategy("client2vec", {"strategy": "federated"}).privacy_conflict("dp-sgd")
    assert build_strategy("client2vec", {"index": "mean_embedding", "local": False}).privacy_conflict("dp-sgd") is None


def test_the_scenario_refuses_the_global_strategy_under_dp_sgd() -> None:
    from p2pfl.scenario.schema import load_scenario

    with pytest.raises(ConfigError, match="privacy.mode: client2vec: the global strategy sends 128 image embeddings"):
        load_scenario("scenarios/client2vec_digits.toml", ['privacy.mode="dp-sgd"', "privacy.noise_multiplier=1.0"])
    load_scenario("scenarios/client2vec_digits.toml", [])


def test_the_coordinator_half_trains_on_finite_batches_and_drops_the_rest() -> None:
    from p2pfl.algorithms.client2vec import Client2VecHalf
    from p2pfl.runtime.coordinator_half import CoordinatorEnv, Submission

    env = CoordinatorEnv(model=cnn(1, 8, CLASSES), rounds=1, seed=0, num_classes=CLASSES, nodes=("a", "b"))
    half = Client2VecHalf(env, embed_dim=16, d_model=8, heads=2, layers=1, ff_dim=16, index_epochs=1)
    g = torch.Generator().manual_seed(0)
    good = Submission("a", {"d": torch.randn(128, 16, generator=g), "l": torch.randn(128, 16, generator=g)}, {"n_train": 200})
    bad = Submission("b", {"d": torch.full((128, 16), math.nan), "l": torch.randn(128, 16, generator=g)}, {"n_train": 200})
    assert half.expected("batch").spec == {"d": ((128, 16), "float32"), "l": ((128, 16), "float32")}
    reply = half.setup([good, bad])
    assert reply.info["samples"] == 128 and reply.info["dropped_non_finite"] == ["b"]
    assert all(torch.isfinite(v).all() for v in reply.parts["setup.dsa_ign"].values())
    with pytest.raises(ValueError, match="non-finite"):
        half.setup([bad])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_coordinator_trains_dsa_ign_on_its_device_and_answers_with_host_tensors() -> None:
    from p2pfl.algorithms.client2vec import Client2VecHalf
    from p2pfl.runtime.coordinator_half import CoordinatorEnv, Submission

    g = torch.Generator().manual_seed(0)
    batch = Submission("a", {"d": torch.randn(128, 16, generator=g), "l": torch.randn(128, 16, generator=g)}, {"n_train": 200})
    states = {}
    for device, epochs in (("cpu", 0), ("cpu", 3), ("cuda", 3)):
        env = CoordinatorEnv(model=cnn(1, 8, CLASSES), rounds=1, seed=0, num_classes=CLASSES, nodes=("a",),
                             device=torch.device(device))
        half = Client2VecHalf(env, embed_dim=16, d_model=8, heads=2, layers=1, ff_dim=16, dropout=0.0, index_epochs=epochs)
        states[device, epochs] = half.setup([batch]).parts["setup.dsa_ign"]
    assert all(v.device.type == "cpu" for v in states["cuda", 3].values())

    def flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([v.flatten().float() for v in state.values()])

    # Same initialisation and batch order: the devices differ by rounding (Adam magnifies it in
    # parameters with tiny gradients), far less than what training moved.
    moved = (flat(states["cpu", 3]) - flat(states["cpu", 0])).norm()
    assert moved > 0
    assert (flat(states["cuda", 3]) - flat(states["cpu", 3])).norm() < 0.05 * moved


def test_the_fedavg_row_builds_no_index_and_needs_no_coordinator() -> None:
    off = {"sampling": False, "aggregation": False, "local": False}
    assert not needs_coordinator("client2vec", off)
    strategy = build_strategy("client2vec", off)
    assert strategy.privacy_conflict("dp-sgd") is None
    ctx = make_ctx()
    assert ctx.exchange is None  # an index would need the exchange and raise
    strategy.setup(ctx)
    assert strategy.indices == {}


def write_results(path, seed: int = 3, n_train: dict[str, int] | None = None) -> dict[str, ClientIndex]:
    import json

    g = torch.Generator().manual_seed(5)
    nodes = ("node-0",) + PEERS
    indices = {n: ClientIndex(torch.randn(4, generator=g), torch.rand(4, generator=g)) for n in nodes}
    sizes = n_train or {n: 40 + i for i, n in enumerate(nodes)}
    path.write_text(json.dumps({
        "scenario": {"seed": seed},
        "nodes": [{"id": n, "n_train": sizes[n]} for n in nodes],
        "client2vec": {"strategy": "federated", "indices": {n: i.full.tolist() for n, i in indices.items()},
                       "feature_indices": {n: i.feature.tolist() for n, i in indices.items()}},
    }))
    return indices


def test_indices_from_an_earlier_run_are_adopted_exactly_and_refused_on_other_data(tmp_path) -> None:
    ctx = make_ctx()
    own = len(ctx.data.train)
    path = tmp_path / "results.json"
    written = write_results(path, n_train={"node-0": own, **{p: 40 for p in PEERS}})
    strategy = build_strategy("client2vec", resolve_run_inputs("client2vec", {"indices_from": str(path)}, 3))
    assert not strategy.needs_coordinator  # the global strategy's coordinator is not needed to reuse
    strategy.setup(ctx)
    for node, index in written.items():
        assert torch.equal(strategy.indices[node].feature, index.feature)
        assert torch.equal(strategy.indices[node].label, index.label)
    assert strategy.n_train["node-1"] == 40 and strategy.n_train["node-0"] == own

    write_results(path, seed=4, n_train={"node-0": own, **{p: 40 for p in PEERS}})
    with pytest.raises(ValueError, match="seed 4 \\(this run: 3\\)"):
        build_strategy("client2vec", resolve_run_inputs("client2vec", {"indices_from": str(path)}, 3)).setup(make_ctx())
    write_results(path, n_train={"node-0": own + 1, **{p: 40 for p in PEERS}})
    with pytest.raises(ValueError, match=f"node-0 trained on {own + 1} samples"):
        build_strategy("client2vec", resolve_run_inputs("client2vec", {"indices_from": str(path)}, 3)).setup(make_ctx())
    with pytest.raises(ConfigError, match="indices_from: cannot read"):
        resolve_run_inputs("client2vec", {"indices_from": str(tmp_path / "missing.json")}, 3)
    (tmp_path / "other.json").write_text('{"nodes": []}')
    with pytest.raises(ConfigError, match="holds no Client2Vec indices"):
        build_strategy("client2vec", resolve_run_inputs("client2vec", {"indices_from": str(tmp_path / "other.json")}, 3))


def test_indices_from_with_a_seed_placeholder_reads_the_run_of_this_seed(tmp_path) -> None:
    ctx = make_ctx()
    (tmp_path / "seed3").mkdir()
    written = write_results(tmp_path / "seed3" / "results.json", n_train={"node-0": len(ctx.data.train), **{p: 40 for p in PEERS}})
    params = resolve_run_inputs("client2vec", {"indices_from": str(tmp_path / "seed{seed}" / "results.json")}, ctx.seed)
    strategy = build_strategy("client2vec", params)
    strategy.setup(ctx)  # ctx.seed == 3
    assert torch.equal(strategy.indices["node-4"].full, written["node-4"].full)


def test_a_restored_strategy_trains_exactly_as_the_one_that_wrote_the_checkpoint() -> None:
    import json

    original = with_indices(build_strategy("client2vec", {"mu": 5.0}))
    original.fit(make_ctx())  # round 1 trains P and the second classifier
    original.history, original.last_cohort, original.last_drawn = {"node-1": 0.5}, ["node-1"], {"node-1": 1}
    state = json.loads(json.dumps(original.state_dict(), allow_nan=False))  # what a checkpoint holds
    restored = build_strategy("client2vec", {"mu": 5.0})
    restored.load_state_dict(state)
    assert restored.state_dict() == original.state_dict()
    for node, index in original.indices.items():
        assert torch.equal(restored.indices[node].feature, index.feature) and restored.n_train[node] == original.n_train[node]
    a, b = make_ctx(round_=2, seed=1), make_ctx(round_=2, seed=1)
    original.fit(a)
    restored.fit(b)
    for key, value in part_state(a.model, "full").items():
        assert torch.equal(value, part_state(b.model, "full")[key]), key
    for key, value in original._eq4.state_dict().items():
        assert torch.equal(value, restored._eq4.state_dict()[key]), key
    bad = json.loads(json.dumps(state))
    bad["eq4"]["projection"]["float32"] = bad["eq4"]["projection"]["float32"][:-8]
    with pytest.raises(ValueError, match="needs .* bytes"):
        build_strategy("client2vec", {}).load_state_dict(bad)


def test_a_path_the_scenario_layer_did_not_read_is_a_clear_error_not_a_file_read(tmp_path) -> None:
    """The algorithm never reads files: `indices_from` reaches it read (p2pfl.scenario.run_inputs)."""
    strategy = build_strategy("client2vec", {"indices_from": str(tmp_path / "seed{seed}" / "results.json")})
    with pytest.raises(RuntimeError, match="was not read: the scenario layer reads it"):
        strategy.setup(make_ctx())


def test_a_small_node_uploads_every_pair_and_the_coordinator_trains_on_each_once() -> None:
    import numpy as np

    from p2pfl.algorithms.client2vec import Client2VecHalf
    from p2pfl.algorithms.client2vec.index import BATCH, distinct_pairs, upload_rows
    from p2pfl.runtime.coordinator_half import CoordinatorEnv, Submission

    rng = np.random.default_rng(0)
    full = upload_rows(500, rng)
    assert len(full) == BATCH and len(set(full.tolist())) == BATCH  # a full node: distinct rows, as before
    small = upload_rows(3, rng)
    assert len(small) == BATCH and set(small.tolist()) == {0, 1, 2}  # every pair at least once

    g = torch.Generator().manual_seed(0)
    d, lab = torch.randn(3, 16, generator=g), torch.randn(3, 16, generator=g)
    rows = torch.as_tensor(small)
    kept_d, kept_l = distinct_pairs(d[rows], lab[rows])
    first_seen = list(dict.fromkeys(small.tolist()))  # by hand: each pair once, in order of appearance
    assert torch.equal(kept_d, d[first_seen]) and torch.equal(kept_l, lab[first_seen])
    # the same image under another label is another pair
    twin_d, twin_l = distinct_pairs(torch.cat([d[:1], d[:1]]), torch.cat([lab[:1], lab[1:2]]))
    assert len(twin_d) == 2 and torch.equal(twin_l, torch.cat([lab[:1], lab[1:2]]))

    env = CoordinatorEnv(model=cnn(1, 8, CLASSES), rounds=1, seed=0, num_classes=CLASSES, nodes=("a", "b"))
    half = Client2VecHalf(env, embed_dim=16, d_model=8, heads=2, layers=1, ff_dim=16, index_epochs=2)
    many = Submission("a", {"d": torch.randn(128, 16, generator=g), "l": torch.randn(128, 16, generator=g)}, {"n_train": 200})
    few = Submission("b", {"d": d[rows], "l": lab[rows]}, {"n_train": 3})
    reply = half.setup([many, few])
    assert reply.info["samples"] == 128 + 3 and reply.info["uploaded"] == 2 * 128
    assert reply.info["steps"] == 2 * 2  # two epochs of ceil(131 / 128) batches, not of 256 rows
