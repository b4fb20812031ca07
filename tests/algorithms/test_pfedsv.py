"""pFedSV driven in-process: hand-built RoundContexts, peers as PeerModels from real models."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from p2pfl.algorithms import build_strategy
from p2pfl.algorithms.pfedsv import PFedSV
from p2pfl.core.relevance import pfedsv_weights
from p2pfl.core.shapley import exact_shapley
from p2pfl.data import NodeData, Split
from p2pfl.errors import ConfigError
from p2pfl.models import SplitModel, cnn, load_part, part_state
from p2pfl.runtime.strategy import ArtefactSink, Fetch, PeerModel, RoundContext
from p2pfl.training import LocalTrainer, TrainConfig

CLASSES = 3


def prototypes(seed: int = 0) -> torch.Tensor:
    return torch.randn(CLASSES, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


def make_split(n: int, seed: int, labels: list[int] | None = None, relabel: dict[int, int] | None = None) -> Split:
    """Class-c images are prototype c plus noise; `relabel` permutes the labels (a harmful peer)."""
    g = torch.Generator().manual_seed(seed)
    classes = torch.tensor(labels if labels is not None else list(range(CLASSES)))
    y = classes[torch.randint(len(classes), (n,), generator=g)]
    x = prototypes()[y] + 0.6 * torch.randn(n, 1, 8, 8, generator=g)
    if relabel:
        y = torch.tensor([relabel.get(int(c), int(c)) for c in y])
    return Split(x, y)


def make_data(seed: int, **kw) -> NodeData:
    return NodeData(0, make_split(96, seed, **kw), make_split(60, seed + 1000, **kw), make_split(30, seed + 2000, **kw), None)


def trained_model(seed: int, data: NodeData | None = None, epochs: int = 4) -> SplitModel:
    torch.manual_seed(seed)
    model = cnn(1, 8, CLASSES)
    trainer = LocalTrainer(TrainConfig(epochs=epochs, batch_size=16), seed=seed)
    trainer.fit(model, (data or make_data(seed)).train)
    return model


def peer_model(sender: str, model: SplitModel, part: str = "full", round_: int = 1, n_train: int = 96) -> PeerModel:
    return PeerModel(sender, part, round_, round_, {k: v.clone() for k, v in part_state(model, part).items()},
                     {"n_train": n_train})


def context(model: SplitModel, peers, data: NodeData | None = None, seed: int = 0, round_: int = 1) -> RoundContext:
    return RoundContext(
        node_id="me", round=round_, rounds=5, peers=tuple(peers), model=model, data=data or make_data(0),
        trainer=LocalTrainer(TrainConfig(epochs=1, batch_size=16)), rng=np.random.default_rng(seed),
        artefacts=ArtefactSink("me", None), log=lambda _: None,
    )


def saved(ctx: RoundContext, name: str) -> dict:
    return [e["value"] for e in ctx.artefacts.saved if e["name"] == name][-1]


@pytest.fixture(scope="module")
def world():
    """Own model, two helpful peers (same task), one harmful (permuted labels), one noise model."""
    torch.set_num_threads(1)
    own = trained_model(0)
    good = [trained_model(s) for s in (1, 2)]
    harmful = trained_model(3, make_data(3, relabel={0: 1, 1: 2, 2: 0}))
    noise = copy.deepcopy(own)
    with torch.no_grad():
        for p in noise.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(9)) * 3.0)
    return {"own": own, "good": good, "harmful": harmful, "noise": noise}


PEERS = ["g1", "g2", "bad", "noise", "u1", "u2", "u3"]


def arrivals(world, part: str = "full") -> list[PeerModel]:
    models = {"g1": world["good"][0], "g2": world["good"][1], "bad": world["harmful"], "noise": world["noise"]}
    return [peer_model(s, m, part) for s, m in models.items()]


def test_round_one_downloads_k_random_peers():
    draws = set()
    for seed in range(20):
        strategy = PFedSV(k=3)
        ctx = context(cnn(1, 8, CLASSES), PEERS, seed=seed)
        strategy.setup(ctx)
        fetches = strategy.configure_fetch(ctx)
        assert len(fetches) == 3 and all(f.part == "full" for f in fetches)
        assert len({f.peer for f in fetches}) == 3
        draws.add(frozenset(f.peer for f in fetches))
    assert len(draws) > 10  # random, not a fixed prefix of the peer list


def test_harmful_peers_get_negative_values_and_are_dropped(world):
    strategy = PFedSV(k=4, k_min=1)
    model = copy.deepcopy(world["own"])
    ctx = context(model, PEERS)
    strategy.setup(ctx)
    strategy.aggregate(ctx, arrivals(world))
    sh = saved(ctx, "shapley")
    sv = dict(zip(sh["peers"], sh["values"]))
    assert sv["g1"] > 0 and sv["g2"] > 0
    assert sv["bad"] < 0 and sv["noise"] < 0
    assert strategy.relevance["bad"] < 0 and strategy.relevance["noise"] < 0
    assert strategy.relevance["g1"] > 0 and strategy.relevance["u1"] == 0.0
    # Its trust in each peer is the relevance of those it scored; u1, never downloaded, is not judged.
    assert strategy.peer_scores(ctx) == {p: strategy.relevance[p] for p in sv if p != "me"}
    weights = dict(zip(saved(ctx, "shapley")["peers"], saved(ctx, "shapley")["weights"]))
    assert weights["bad"] == 0.0 and weights["noise"] == 0.0
    # Efficiency: the values share out exactly v(S) - v(empty).
    assert sum(sv.values()) == pytest.approx(
        ctx.trainer.evaluate(_average([world["own"], *world["good"], world["harmful"], world["noise"]]), ctx.data.val)[0],
        abs=1e-9,
    )
    # Next round: both positive peers plus one unseen peer (k_min = 1); the harmful never.
    assert strategy.k == 3
    ctx.round, ctx.rng = 2, np.random.default_rng(5)
    nxt = {f.peer for f in strategy.configure_fetch(ctx)}
    assert {"g1", "g2"} <= nxt and nxt - {"g1", "g2"} <= {"u1", "u2", "u3"}
    rec = ctx.artefacts.records
    assert rec["k"] == 4 and rec["k_next"] == 3 and rec["downloaded"] == ["g1", "g2", "bad", "noise"]
    assert rec["utility_evaluations"] == 2**5 - 1
    assert saved(ctx, "relevance")["peers"] == PEERS


def _average(models: list[SplitModel]) -> SplitModel:
    out = copy.deepcopy(models[0])
    states = [m.state_dict() for m in models]
    out.load_state_dict({k: sum(s[k] for s in states) / len(states) for k in states[0]})
    return out


def test_new_model_is_the_shapley_weighted_average_computed_independently(world):
    strategy = PFedSV(k=4, exact_max_players=6)
    model = copy.deepcopy(world["own"])
    ctx = context(model, PEERS)
    members = [world["own"], *world["good"], world["harmful"], world["noise"]]
    names = ["me", "g1", "g2", "bad", "noise"]
    trainer = LocalTrainer(TrainConfig())

    def v(coalition):  # the paper's utility, through load_state_dict and the trainer
        return trainer.evaluate(_average([members[names.index(p)] for p in coalition]), ctx.data.val)[0]

    ref = exact_shapley(names, v)
    flat = [torch.cat([t.flatten() for t in m.state_dict().values()]) for m in members]
    dist = [float((f - flat[0]).norm()) for f in flat]
    w = pfedsv_weights([ref.values[p] for p in names], dist)
    expected = {k: sum(float(wi) * m.state_dict()[k] for wi, m in zip(w, members)) for k in model.state_dict()}

    strategy.aggregate(ctx, arrivals(world))
    assert saved(ctx, "shapley")["values"] == pytest.approx([ref.values[p] for p in names], abs=1e-12)
    assert saved(ctx, "shapley")["weights"] == pytest.approx(w.tolist(), rel=1e-6)
    for k, t in model.state_dict().items():
        torch.testing.assert_close(t, expected[k], rtol=1e-5, atol=1e-6)


def test_no_arrivals_keeps_the_model_and_relevance():
    model = cnn(1, 8, CLASSES)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for variant in ("full", "D+C"):
        strategy = PFedSV(k=2, variant=variant)
        ctx = context(model, PEERS)
        strategy.aggregate(ctx, [])
        for k, v in model.state_dict().items():
            assert torch.equal(v, before[k])
        assert ctx.artefacts.records["downloaded"] == [] and ctx.artefacts.records["utility_evaluations"] == 0
        assert set(strategy.relevance.values()) == {0.0}


def test_no_positive_value_keeps_the_own_model(world):
    model = copy.deepcopy(world["own"])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    strategy = PFedSV(k=1, empty_utility="chance")
    ctx = context(model, PEERS)
    # Permuted validation labels: every coalition scores below chance, so every value is negative.
    ctx.data = make_data(0, relabel={0: 1, 1: 2, 2: 0})
    strategy.aggregate(ctx, [peer_model("g1", world["good"][0])])
    sh = saved(ctx, "shapley")
    assert max(sh["values"]) < 0 and sh["weights"] == [0.0, 0.0]
    assert ctx.artefacts.records["kept_own_model"] is True
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    assert strategy.relevance["g1"] < 0


def test_unreachable_peers_yield_their_slot_for_one_round():
    strategy = PFedSV(k=2)
    ctx = context(cnn(1, 8, CLASSES), ["a", "b", "c", "d"])
    strategy.relevance = {"a": 0.5, "b": 0.4, "c": 0.0, "d": -0.2}
    strategy.seen = {"a", "b", "d"}
    assert [f.peer for f in strategy.configure_fetch(ctx)] == ["a", "b"]
    ctx.unreachable = {"a"}
    assert [f.peer for f in strategy.configure_fetch(ctx)] == ["b", "c"]


def test_an_uninformative_round_does_not_end_discovery():
    """All coalitions equally accurate -> all values 0: those peers stay candidates, unlike harmful ones."""
    strategy = PFedSV(k=3)
    ctx = context(cnn(1, 8, CLASSES), ["a", "b", "c"])
    strategy.relevance, strategy.seen = {"a": 0.0, "b": 0.0, "c": -0.1}, {"a", "b", "c"}
    strategy.aggregate(ctx, [])
    assert strategy.k == 1
    assert [f.peer for f in strategy.configure_fetch(ctx)] in (["a"], ["b"])


def test_reprobe_keeps_a_node_that_found_no_helpful_peer_looking():
    peers = ["a", "b", "c"]
    paper = PFedSV(k=2)
    ctx = context(cnn(1, 8, CLASSES), peers)
    paper.relevance = {"a": -0.1, "b": -0.3, "c": -0.2}
    paper.seen, paper.k = set(peers), 0
    assert paper.configure_fetch(ctx) == []  # the paper's mechanism: local for good

    strategy = PFedSV(k=2, reprobe=1)
    strategy.relevance, strategy.seen, strategy.k = dict(paper.relevance), set(peers), 0
    strategy.last_scored = {"a": 3, "b": 1, "c": 2}
    assert [f.peer for f in strategy.configure_fetch(ctx)] == ["b"]  # longest unscored
    strategy.relevance["a"] = 0.2
    strategy.k = 1
    assert [f.peer for f in strategy.configure_fetch(ctx)] == ["a", "b"]


def test_dc_fetches_heads_for_top_k_and_bodies_for_averaging():
    strategy = PFedSV(k=2, variant="D+C")
    assert strategy.shared_parts == ("body", "head")
    ctx = context(cnn(1, 8, CLASSES), PEERS)
    fetches = strategy.configure_fetch(ctx)
    heads = [f for f in fetches if f.part == "head"]
    bodies = [f for f in fetches if f.part == "body"]
    assert len(heads) == 2 and [f.peer for f in bodies] == PEERS
    few = PFedSV(k=2, variant="D+C", body_peers=3)
    assert len([f for f in few.configure_fetch(ctx) if f.part == "body"]) == 3
    assert Fetch(heads[0].peer, "head") in fetches


def _shared_body_world(world):
    """Peers that share the own model's body exactly, with their own heads."""
    own = copy.deepcopy(world["own"])
    peers = {}
    for name, m in [("g1", world["good"][0]), ("bad", world["harmful"]), ("noise", world["noise"]), ("g2", world["good"][1])]:
        p = copy.deepcopy(m)
        load_part(p, part_state(own, "body"))
        peers[name] = p
    return own, peers


@pytest.mark.parametrize("exact_max_players", [6, 0])
def test_dc_matches_the_full_game_when_bodies_are_equal_and_computes_features_once(world, exact_max_players):
    own, peers = _shared_body_world(world)
    full_model, dc_model = copy.deepcopy(own), copy.deepcopy(own)
    full = PFedSV(k=4, exact_max_players=exact_max_players)
    dc = PFedSV(k=4, exact_max_players=exact_max_players, variant="D+C")
    full_ctx, dc_ctx = context(full_model, PEERS, seed=11), context(dc_model, PEERS, seed=11)

    calls = []
    hook = dc_model.body.register_forward_hook(lambda *_: calls.append(1))
    full.aggregate(full_ctx, [peer_model(n, m) for n, m in peers.items()])
    dc_arrivals = [peer_model(n, m, "head") for n, m in peers.items()] + [peer_model(n, m, "body") for n, m in peers.items()]
    dc.aggregate(dc_ctx, dc_arrivals)
    hook.remove()

    assert len(calls) == 1  # one body pass for the whole coalition game
    a, b = saved(full_ctx, "shapley"), saved(dc_ctx, "shapley")
    assert a["peers"] == b["peers"]
    assert b["values"] == pytest.approx(a["values"], abs=1e-9)
    assert b["weights"] == pytest.approx(a["weights"], rel=1e-5)
    assert dc_ctx.artefacts.records["utility_evaluations"] == full_ctx.artefacts.records["utility_evaluations"]
    for k, t in dc_model.state_dict().items():
        torch.testing.assert_close(t, full_model.state_dict()[k], rtol=1e-5, atol=1e-6)


def test_dc_averages_bodies_by_sample_count(world):
    model = copy.deepcopy(world["own"])
    other = world["good"][0]
    strategy = PFedSV(k=1, variant="D+C")
    ctx = context(model, PEERS)
    own_body = part_state(world["own"], "body")
    strategy.aggregate(ctx, [peer_model("g1", other, "body", n_train=3 * 96)])
    for k, v in part_state(model, "body").items():
        torch.testing.assert_close(v, 0.25 * own_body[k] + 0.75 * part_state(other, "body")[k])
    # No head arrived: the head is the node's own.
    for k, v in part_state(model, "head").items():
        assert torch.equal(v, part_state(world["own"], "head")[k])


def test_monte_carlo_and_chance_utility(world):
    strategy = PFedSV(k=4, exact_max_players=2, permutations=7, empty_utility="chance")
    ctx = context(copy.deepcopy(world["own"]), PEERS)
    strategy.aggregate(ctx, arrivals(world))
    sh = saved(ctx, "shapley")
    assert sh["method"] == "monte_carlo"
    grand = ctx.trainer.evaluate(_average([world["own"], *world["good"], world["harmful"], world["noise"]]), ctx.data.val)[0]
    assert sum(sh["values"]) == pytest.approx(grand - 1 / CLASSES, abs=1e-9)
    assert ctx.artefacts.records["utility_evaluations"] <= 7 * 5


def test_registry_validates_parameters():
    s = build_strategy("pfedsv", {"k": 3, "alpha": 0.9, "variant": "D+C"})
    assert isinstance(s, PFedSV) and s.k == 3 and s.variant == "D+C"
    with pytest.raises(ConfigError):
        build_strategy("pfedsv", {"kk": 3})
    for bad in ({"variant": "C"}, {"empty_utility": "one"}, {"k_min": 0}, {"alpha": 1.0}, {"reprobe": -1}):
        with pytest.raises(ConfigError):
            build_strategy("pfedsv", bad)


def test_rounds_converge_on_the_helpful_peers(world):
    """Several rounds against a fixed network: downloads settle on the peers that help."""
    models = {"g1": world["good"][0], "g2": world["good"][1], "u2": trained_model(5),
              "bad": world["harmful"], "noise": world["noise"], "u1": world["harmful"], "u3": world["noise"]}
    helpful = {"g1", "g2", "u2"}
    strategy = PFedSV(k=2, k_min=2)
    ctx = context(copy.deepcopy(world["own"]), PEERS, seed=3)
    strategy.setup(ctx)
    for r in range(1, 7):
        ctx.round = r
        fetched = [f.peer for f in strategy.configure_fetch(ctx)]
        if r > 1:
            # Known helpful peers are always fetched again, known harmful ones never while unseen remain.
            assert {p for p in PEERS if strategy.relevance[p] > 0} <= set(fetched)
            if len(strategy.seen) < len(PEERS):
                assert not {p for p in fetched if strategy.relevance[p] < 0}
        strategy.aggregate(ctx, [peer_model(p, models[p], round_=r) for p in fetched])
    assert strategy.seen == set(PEERS)
    assert {p for p in PEERS if strategy.relevance[p] > 0} == helpful
    assert strategy.k == len(helpful)
