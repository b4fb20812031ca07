"""Trust over a run: counts, mean scores, conduct and rankings from round records, worked by hand,
and a poisoner found by a real run's conduct."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from p2pfl.report.trust_figures import plot_trust, trust_matrix, trust_table
from p2pfl.scenario.trust import FAR_BOUND_FACTOR, node_trust, ranked_last, ranking, run_trust

ROUNDS = [
    # a: taken as sent twice, scored 0.5 then 0.3; b: pulled back 4x (buffers and weights), then refused;
    # c: silent, then stale
    {"round": 1, "arrived": ["a", "b"], "peers_bounded": {"b": ["buffers over", "weights over"]}, "peers_bounded_factor": {"b": 4.0},
     "silent": ["c"], "peer_scores": {"a": 0.5, "b": 0.9}},
    {"round": 2, "arrived": ["a", "c"], "stale": ["c"], "peers_refused": {"b": "over update_refuse"},
     "peer_scores": {"a": 0.3, "c": 0.1}},
    {"round": 3, "participated": False, "arrived": ["a"], "peer_scores": {"a": -9.0}},  # sat out: not counted
]


def test_counts_scores_and_conduct_by_hand() -> None:
    trust = node_trust(ROUNDS)
    assert trust["a"] == {"asked": 2, "answered": 2, "stale": 0, "bounded": 0, "bounded_counts": 0, "refused": 0,
                          "silent": 0, "conduct": 1.0, "score": pytest.approx(0.4), "scored": 2}
    # b answered once (pulled back 4x) and was refused once: the geometric mean of 1/4 and 1/10
    assert trust["b"]["asked"] == 2 and trust["b"]["bounded"] == 1 and trust["b"]["refused"] == 1
    assert trust["b"]["bounded_counts"] == 2  # one round, two counts, each named
    # a record from before each count was kept names one reason as a string: one count
    assert node_trust([{"round": 1, "arrived": ["b"], "peers_bounded": {"b": "over"}}])["b"]["bounded_counts"] == 1
    assert trust["b"]["conduct"] == pytest.approx(math.sqrt(1 / 4 / FAR_BOUND_FACTOR))
    assert trust["b"]["score"] == pytest.approx(0.9)
    # c: silence is counted, not held against it; a stale part taken is taken as sent
    assert trust["c"]["silent"] == 1 and trust["c"]["stale"] == 1 and trust["c"]["conduct"] == 1.0
    assert ranking(trust) == ["b", "a", "c"]  # the strategy's scores: b was of most use
    assert ranking(trust, "conduct") == ["a", "c", "b"]  # equal conduct in name order
    assert ranked_last(trust, ["b"], "conduct") and not ranked_last(trust, ["b"])


def test_a_tie_at_the_bottom_is_not_ranked_last_and_without_scores_conduct_ranks() -> None:
    rounds = [{"round": 1, "arrived": ["a", "b"]}]
    trust = node_trust(rounds)
    assert ranking(trust) == ["a", "b"]  # no strategy score: by conduct, equal
    assert not ranked_last(trust, ["b"])


def test_the_federation_view_places_each_peer_over_the_nodes_that_judged_it(tmp_path: Path) -> None:
    nodes = [
        {"id": "node-0", "rounds": [{"round": 1, "arrived": ["node-1", "node-2"],
                                     "peer_scores": {"node-1": 1.0, "node-2": 0.0}}]},
        {"id": "node-1", "rounds": [{"round": 1, "arrived": ["node-0", "node-2"],
                                     "peer_scores": {"node-0": 0.2, "node-2": 0.1}}]},
        {"id": "node-2", "rounds": []},
    ]
    trust = run_trust(nodes)
    assert trust is not None
    assert trust["federation"]["node-2"] == {"mean_place": 1.0, "ranked_by": 2}
    assert trust["federation"]["node-1"] == {"mean_place": 0.0, "ranked_by": 1}
    ids, places = trust_matrix(trust)
    assert ids == ["node-0", "node-1", "node-2"]
    assert places[0, 2] == 1.0 and places[1, 0] == 0.0 and math.isnan(places[2, 0])
    results = {"trust": trust}
    assert plot_trust(results, tmp_path).is_file()
    table = trust_table(results, tmp_path).read_text()
    assert "| node-0 | node-2 | 0.000 |" in table and "| node-2 | 1.00 | 2 |" in table
    assert run_trust([{"id": "node-0", "rounds": []}]) is None


@pytest.mark.slow
def test_a_poisoner_has_the_worst_conduct_at_every_honest_node(tmp_path: Path) -> None:
    """A real run: node 0 publishes Gaussian noise to three FedAvg peers that bound what they take
    (runtime.update_bound = 1): every honest node ranks it last by conduct, and results.json and
    the report carry the trust."""
    from p2pfl.scenario.launcher import run_scenario

    from tests.runtime.helpers import write_tiny

    scenario = write_tiny(tmp_path, nodes=4, rounds=3, samples=60,
                          extra='\n[attack]\nkind = "noise"\nnodes = [0]\nscale = 1.0\n')
    results, code = run_scenario(scenario, tmp_path / "run", ["runtime.update_bound=1"], progress=False, quiet=True)
    assert code == 0
    stored = json.loads((tmp_path / "run" / "results.json").read_text())["trust"]
    for nid in ("node-1", "node-2", "node-3"):
        view = stored["nodes"][nid]
        assert view["conduct_ranking"][-1] == "node-0", view["peers"]
        assert ranked_last(view["peers"], ["node-0"], "conduct")
        assert view["peers"]["node-0"]["bounded"] == 3
    from p2pfl.report import report_run

    paths = report_run(tmp_path / "run")
    assert {"trust.png", "trust.md"} <= {p.name for p in paths}
    from p2pfl.report.dashboard import dashboard_state

    heat = dashboard_state(tmp_path / "run")["heatmaps"]["trust"]  # from the rounds files, as a live page reads
    assert heat["ids"][0] == "node-0" and heat["round"] == 3
    assert [row[0] for row in heat["matrix"][1:]] == [1.0, 1.0, 1.0]  # FedAvg scores nobody: by conduct, last


def test_the_ranking_table_counts_honest_nodes_that_put_the_attacker_last() -> None:
    from p2pfl.report.trust_figures import attacker_rank_table

    def run(scores_of_attacker: float) -> dict:
        nodes = [{"id": "node-0", "rounds": []}]
        for i in (1, 2):
            other = f"node-{3 - i}"
            nodes.append({"id": f"node-{i}", "rounds": [{
                "round": 1, "arrived": ["node-0", other], "peers_bounded": {"node-0": "over"},
                "peers_bounded_factor": {"node-0": 5.0}, "peer_scores": {"node-0": scores_of_attacker, other: 0.5}}]})
        return {"scenario": {"attack": {"kind": "noise", "nodes": [0]}}, "nodes": nodes, "trust": run_trust(nodes)}

    table = attacker_rank_table({"pfedsv": [run(0.1), run(0.9)], "clean": [{"scenario": {}, "nodes": []}]})
    assert table is not None
    [row] = [line for line in table.splitlines() if line.startswith("| pfedsv")]
    assert row == "| pfedsv | 2 of 4 (50 %); by seed 2/2, 0/2 | 4 of 4 (100 %); by seed 2/2, 2/2 | 2 |"
    assert attacker_rank_table({"clean": [{"scenario": {}, "nodes": []}]}) is None


def test_tied_peers_share_their_place_and_a_tie_at_the_bottom_names_nobody() -> None:
    """Issue 67, item 8: FedAvg's conduct is 1 for every honest peer; ranked by name, node-3 was
    every node's "least trusted"."""
    from p2pfl.scenario.trust import places

    tied = {p: {"score": None, "conduct": 1.0} for p in ("node-1", "node-2", "node-3")}
    assert places(tied) == {"node-1": 0.5, "node-2": 0.5, "node-3": 0.5}
    mixed = {**tied, "node-4": {"score": None, "conduct": 0.1}}
    assert places(mixed) == {"node-1": 1 / 3, "node-2": 1 / 3, "node-3": 1 / 3, "node-4": 1.0}
    assert places({"node-1": {"score": 0.2, "conduct": 1.0}, "node-2": {"score": 0.9, "conduct": 1.0}}) == {
        "node-2": 0.0, "node-1": 1.0}
