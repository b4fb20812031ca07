"""Client2Vec through real processes: the setup exchange with the coordinator, shared indices, report."""

from __future__ import annotations

import json

import pytest

from p2pfl.core.client2vec import cosine
from p2pfl.report import report_run
from p2pfl.scenario.launcher import run_scenario

pytestmark = pytest.mark.slow

SCENARIO = """
name = "c2v_tiny"
nodes = 4
seed = 0
rounds = 2

[data]
dataset = "digits"
partition = "domain"
domains = ["mnist", "mnistm"]
nodes_per_domain = 2
domain_split = "dirichlet"
alpha = 0.5
min_size = 20
samples_per_node = 160

[model]
name = "lenet"

[algorithm]
name = "client2vec"

[algorithm.params]
fraction = 0.5
index_epochs = 3
# the runtime's mechanics, not the encoders (tests/models/test_encoders.py): the weightless pair keeps it fast
image_encoder = "random_cnn"
label_encoder = "orthonormal"
{extra}

[runtime]
fetch_timeout_s = 60
coordinator_wait_s = 120
linger_s = 10
"""


def test_global_strategy_builds_indices_through_the_coordinator(tmp_path):
    path = tmp_path / "c2v.toml"
    path.write_text(SCENARIO.format(extra=""))
    results, code = run_scenario(path, tmp_path / "run", progress=False, quiet=True)
    assert code == 0, results["summary"]
    coordinator = results["coordinator"]
    assert coordinator["status"] == "ok" and coordinator["rounds"] == []
    setup = coordinator["setup"]
    assert setup["submitted"] == ["node-0", "node-1", "node-2", "node-3"] and setup["info"]["uploaded"] == 4 * 128
    # a node of fewer than 128 pairs fills its upload with repeats; the coordinator trains on each pair once
    assert setup["info"]["samples"] == sum(min(node["n_train"], 128) for node in results["nodes"])
    # the data-derived upload is counted: 128 x (512 + 512) float32 per node, at least
    assert setup["bytes_received"] >= 4 * 128 * 1024 * 4
    c2v = results["client2vec"]
    assert c2v["strategy"] == "global" and sorted(c2v["indices"]) == ["node-0", "node-1", "node-2", "node-3"]
    assert all(len(v) == 1024 for v in c2v["indices"].values())
    assert all(len(v) == 512 for v in c2v["feature_indices"].values())
    for node in results["nodes"]:
        assert node["status"] == "ok" and node["setup"]["bytes_sent"] >= 128 * 1024 * 4
        assert [len(r["strategy"]["drawn"]) for r in node["rounds"]] == [2, 2]  # ceil(0.5 x 3)
        assert "eq4" in node["rounds"][0]["strategy"]
    written = {p.name: p for p in report_run(tmp_path / "run")}
    assert "client_indices.png" in written
    rows = [line.split(" | ") for line in written["client_indices.md"].read_text().splitlines() if line.startswith("| β")]
    sims = {(a, b): cosine(c2v["feature_indices"][a], c2v["feature_indices"][b])
            for a in c2v["indices"] for b in c2v["indices"] if a != b}
    domain = {n["id"]: n["domain"] for n in results["nodes"]}
    same = [v for (a, b), v in sims.items() if domain[a] == domain[b]]
    cross = [v for (a, b), v in sims.items() if domain[a] != domain[b]]
    assert float(rows[0][1]) == pytest.approx(sum(same) / len(same), abs=1e-3)
    assert float(rows[0][2]) == pytest.approx(sum(cross) / len(cross), abs=1e-3)

    # Resumed after its last round, no node sets up again: the indices come from the checkpoints.
    resumed, code = run_scenario(path, tmp_path / "run", progress=False, quiet=True, resume=True)
    assert code == 0, resumed["summary"]
    assert resumed["client2vec"]["indices"] == c2v["indices"]
    assert resumed["coordinator"]["status"] == "ok" and resumed["coordinator"]["setup"] is None
    # With no round left they wait for nobody (they waited start_wait_s, 30 s, for a coordinator
    # that had nothing left to do and had ended).
    assert not any("not up after" in log.read_text() for log in (tmp_path / "run" / "logs").glob("node-*.log"))
    for before, after in zip(results["nodes"], resumed["nodes"]):
        assert after["setup"] == json.loads(json.dumps(before["setup"])) and after["rounds"] == before["rounds"]

    # A second run reads these indices (indices_from) and builds none: no coordinator, nothing sent before round 1.
    path.write_text(SCENARIO.format(extra=f'indices_from = "{tmp_path / "run" / "results.json"}"'))
    again, code = run_scenario(path, tmp_path / "again", progress=False, quiet=True)
    assert code == 0, again["summary"]
    assert again["coordinator"] is None
    assert again["client2vec"]["indices"] == c2v["indices"]
    assert all(not (n["setup"] or {}).get("bytes_sent") for n in again["nodes"])


def test_mean_embedding_index_needs_no_coordinator(tmp_path):
    path = tmp_path / "c2v.toml"
    path.write_text(SCENARIO.format(extra='index = "mean_embedding"\nlocal = false'))
    results, code = run_scenario(path, tmp_path / "run", progress=False, quiet=True)
    assert code == 0, results["summary"]
    assert results["coordinator"] is None and results["client2vec"]["strategy"] == "mean_embedding"


def test_federated_strategy_trains_one_dsa_ign_peer_to_peer(tmp_path):
    path = tmp_path / "c2v.toml"
    path.write_text(SCENARIO.format(extra='strategy = "federated"\nindex_rounds = 4\nindex_fraction = 0.5\n'
                                          'index_local_epochs = 1\nff_dim = 32\nlayers = 1'))
    results, code = run_scenario(path, tmp_path / "run", progress=False, quiet=True)
    assert code == 0, results["summary"]
    assert results["coordinator"] is None and results["client2vec"]["strategy"] == "federated"
    records = [n["setup"]["strategy"]["dsa_ign"] for n in results["nodes"]]
    assert sum(r["steps_trained"] for r in records) == 4 * 2  # ceil(0.5 x 4) nodes in each of 4 steps
    sums = [r["state_sum"] for r in records]  # every node ends with the same DSA-IGN (up to summation order)
    assert max(sums) - min(sums) <= 1e-4 * max(1.0, abs(sums[0]))
    assert len({tuple(v) for v in results["client2vec"]["feature_indices"].values()}) == 4  # own data, own index
