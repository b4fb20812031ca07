"""Issue 31: a worker partitions the data and draws the topology once for all its nodes. A node
built in its own process, or in a worker after others, gets the same slice and neighbours as
the computation from scratch."""

from __future__ import annotations

import pytest

import json
import subprocess
import sys
from pathlib import Path

import torch

from p2pfl.data import build_partition
from p2pfl.data.partition import _assignment, assign, load_pool, node_ground_truth
from p2pfl.runtime.topology import Topology
from p2pfl.scenario.schema import load_scenario

SCENARIO = (str(Path(__file__).parents[2] / "scenarios" / "scale.toml"), ["nodes=60", 'data.partition="dirichlet"', "data.alpha=0.3",
                                     'runtime.topology="regular:4"'])
PROBE = """
import json, sys
from p2pfl.data import build_partition
from p2pfl.runtime.topology import Topology
from p2pfl.scenario.schema import load_scenario
sc = load_scenario(sys.argv[1], json.loads(sys.argv[2]))
i = int(sys.argv[3])
node = build_partition(sc.data, sc.nodes, sc.seed, only=[i]).node(i)
print(json.dumps({"y": node.train.y.tolist(), "test": node.test.y.tolist(),
                  "neighbours": Topology.parse(sc.runtime.topology).neighbours_of(i, sc.nodes, sc.seed)}))
"""


def _probe_in_own_process(index: int) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, SCENARIO[0], json.dumps(SCENARIO[1]), str(index)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


@pytest.mark.slow
def test_nodes_of_one_worker_and_of_their_own_process_get_the_same_slice_and_neighbours() -> None:
    sc = load_scenario(*SCENARIO)
    topology = Topology.parse(sc.runtime.topology)
    in_worker = {}
    for i in range(sc.nodes):  # as a worker builds its nodes, one after another, caches warm
        node = build_partition(sc.data, sc.nodes, sc.seed, only=[i]).node(i)
        in_worker[i] = (node.train.y.tolist(), node.test.y.tolist(), topology.neighbours_of(i, sc.nodes, sc.seed))
    assert _assignment.cache_info().hits >= sc.nodes - 1
    for i in (0, 17, sc.nodes - 1):
        alone = _probe_in_own_process(i)
        assert (alone["y"], alone["test"], alone["neighbours"]) == in_worker[i]

    # ... and the same as computing from scratch, without any cache
    pool = load_pool(sc.data)
    fresh = assign(sc.data, pool, sc.nodes, sc.seed)
    truth = node_ground_truth(sc.data, pool, fresh)
    cached, cached_truth = _assignment(sc.data, sc.nodes, sc.seed)
    for (tr, va, te), (ctr, cva, cte) in zip(fresh["nodes"], cached["nodes"]):
        assert (tr == ctr).all() and (va == cva).all() and (te == cte).all()
    assert truth == cached_truth
    graph = topology.graph(sc.nodes, sc.seed)
    assert [sorted(graph.neighbors(i)) for i in range(sc.nodes)] == topology.neighbours(sc.nodes, sc.seed)
    assert torch.equal(torch.tensor(in_worker[5][0]), torch.tensor(pool.y[fresh["nodes"][5][0]]))


def test_read_ahead_leaves_a_forking_parent_the_data_its_children_take_their_slices_from() -> None:
    """`read_ahead` (the forking parent, before its forks) reads the pool and makes the assignment;
    a node built after it reads nothing again and gets the slice built from scratch. The launcher's
    `release_loaded` forgets both."""
    from p2pfl.data import read_ahead, release_loaded
    from p2pfl.data.partition import _pool

    sc = load_scenario(*SCENARIO)
    fresh = build_partition(sc.data, sc.nodes, sc.seed, only=[7]).node(7)
    release_loaded()
    assert _pool.cache_info().currsize == 0 and _assignment.cache_info().currsize == 0
    read_ahead(sc.data, sc.nodes, sc.seed)
    pools, assignments = _pool.cache_info(), _assignment.cache_info()
    assert pools.currsize == 1 and assignments.currsize == 1
    node = build_partition(sc.data, sc.nodes, sc.seed, only=[7]).node(7)
    assert _pool.cache_info().misses == pools.misses and _assignment.cache_info().misses == assignments.misses
    assert torch.equal(node.train.x, fresh.train.x) and torch.equal(node.test.y, fresh.test.y)
