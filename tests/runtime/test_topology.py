"""Topologies: seeded, connected graphs every node computes alike; nodes fetch from neighbours only."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import pytest

from p2pfl.errors import ConfigError
from p2pfl.runtime.topology import Topology
from p2pfl.scenario.launcher import run_scenario
from p2pfl.scenario.schema import load_scenario

from .helpers import write_tiny


@pytest.mark.parametrize("spec,nodes,degrees", [
    ("full", 7, {6}), ("ring", 7, {2}), ("regular:4", 30, {4}), ("regular:3", 100, {3}),
])
def test_graphs_are_connected_with_the_asked_degree_and_the_same_for_a_seed(spec: str, nodes: int, degrees: set[int]) -> None:
    topology = Topology.parse(spec)
    graph = topology.graph(nodes, seed=5)
    assert nx.is_connected(graph) and graph.number_of_nodes() == nodes
    assert {d for _, d in graph.degree()} == degrees
    assert topology.neighbours(nodes, 5) == topology.neighbours(nodes, 5)
    adjacency = topology.neighbours(nodes, 5)
    assert all(i not in ns and all(i in adjacency[j] for j in ns) for i, ns in enumerate(adjacency))  # symmetric


def test_small_world_is_connected_and_random_graphs_depend_on_the_seed() -> None:
    graph = Topology.parse("small_world:4").graph(30, seed=0)
    assert nx.is_connected(graph) and graph.number_of_edges() == 60  # rewiring keeps the edge count
    assert Topology.parse("regular:4").neighbours(30, 0) != Topology.parse("regular:4").neighbours(30, 1)


@pytest.mark.parametrize("spec,nodes,match", [
    ("star", 5, "unknown topology 'star'"), ("regular", 5, "unknown topology"), ("regular:1", 5, "d >= 2"),
    ("regular:5", 5, "needs more than 5 nodes"), ("regular:3", 5, "nodes x d must be even"),
])
def test_impossible_topologies_are_config_errors(tmp_path: Path, spec: str, nodes: int, match: str) -> None:
    scenario = write_tiny(tmp_path, nodes=nodes)
    with pytest.raises(ConfigError, match=match) as info:
        load_scenario(scenario, [f'runtime.topology="{spec}"'])
    assert info.value.field == "runtime.topology"


@pytest.mark.slow
def test_on_a_ring_fedavg_averages_with_its_two_neighbours_and_moves_fewer_bytes(tmp_path: Path) -> None:
    runs = {}
    for spec in ("full", "ring"):
        (tmp_path / spec).mkdir()
        scenario = write_tiny(tmp_path / spec, nodes=5, rounds=2, samples=40)
        results, code = run_scenario(scenario, tmp_path / spec / "run", [f'runtime.topology="{spec}"', 'runtime.placement="shared"'],
                                     progress=False, quiet=True)
        assert code == 0
        runs[spec] = results
    ring = runs["ring"]
    adjacency = ring["topology"]["adjacency"]
    assert ring["topology"]["spec"] == "ring"
    assert adjacency == {f"node-{i}": sorted([f"node-{(i - 1) % 5}", f"node-{(i + 1) % 5}"]) for i in range(5)}
    for node in ring["nodes"]:
        for r in node["rounds"]:
            assert r["arrived"] == adjacency[node["id"]]
            assert r["strategy"]["aggregated_from"] == adjacency[node["id"]]
    assert len(runs["full"]["topology"]["adjacency"]["node-0"]) == 4
    full_sent = sum(n["totals"]["param_bytes_sent"] for n in runs["full"]["nodes"])
    ring_sent = sum(n["totals"]["param_bytes_sent"] for n in ring["nodes"])
    assert ring_sent == pytest.approx(full_sent / 2, rel=0.05), (ring_sent, full_sent)  # 2 of 4 peers fetch
    assert json.loads((tmp_path / "ring" / "run" / "results.json").read_text())["topology"]["adjacency"] == adjacency


@pytest.mark.parametrize("spec,nodes", [("regular:4", 200), ("regular:3", 130), ("ring", 50), ("small_world:4", 60),
                                        ("full", 9)])
def test_the_locality_order_is_a_seeded_permutation(spec: str, nodes: int) -> None:
    topology = Topology.parse(spec)
    order = topology.locality_order(nodes, seed=3)
    assert sorted(order) == list(range(nodes))
    assert order == topology.locality_order(nodes, seed=3)


def _edges_between_halves(graph: nx.Graph, order: list[int]) -> float:
    first = set(order[: len(order) // 2])
    return sum((u in first) != (v in first) for u, v in graph.edges()) / graph.number_of_edges()


def test_the_locality_order_keeps_most_neighbours_of_a_regular_graph_in_the_same_half() -> None:
    topology = Topology.parse("regular:4")
    graph = topology.graph(400, seed=0)
    # Any split of a random order cuts about half of the edges; the order's halves far fewer.
    assert _edges_between_halves(graph, list(range(400))) > 0.4
    assert _edges_between_halves(graph, topology.locality_order(400, seed=0)) < 0.25
    ring = Topology.parse("ring")
    assert ring.locality_order(40, seed=0) == list(range(40))  # two edges between any two runs already


def test_shared_workers_host_runs_of_the_locality_order(tmp_path: Path) -> None:
    from p2pfl.hosting.shared import SharedHosting
    from p2pfl.scenario.launcher import in_locality_order

    paths = [tmp_path / f"node-{i}.toml" for i in range(10)]
    plan = SharedHosting(torch_threads=1, workers=3).plan(paths)
    assert [len(p) for p in plan.values()] == [3, 3, 4]
    assert [p for run in plan.values() for p in run] == paths  # consecutive runs, every node once

    scenario = load_scenario(write_tiny(tmp_path, nodes=10), ['runtime.placement="shared"', 'runtime.topology="regular:4"'])
    ordered = in_locality_order(scenario, paths)
    assert [int(p.stem.split("-")[1]) for p in ordered] == Topology.parse("regular:4").locality_order(10, scenario.seed)
    one_each = load_scenario(write_tiny(tmp_path, nodes=10), ['runtime.topology="regular:4"'])
    assert in_locality_order(one_each, paths) == paths  # one process per node: nothing to group
