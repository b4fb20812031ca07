"""The coordinator with real processes: DI nodes push statistics, pull the global model."""

from __future__ import annotations

import math

import pytest
import torch

from p2pfl.runtime.checkpoint import load_checkpoint
from p2pfl.scenario.launcher import run_scenario
from p2pfl.wire import NodeKey

pytestmark = pytest.mark.slow

SCENARIO = """
name = "di_tiny"
nodes = 3
seed = 0
rounds = 2

[data]
dataset = "digits"
partition = "domain"
domains = ["mnist", "uci", "usps", "synth"]
held_out_domain = "synth"
samples_per_node = 80

[model]
name = "cnn"

[algorithm]
name = "di"

[algorithm.params]
core_size = 16
cg_iterations = 10

[runtime]
fetch_timeout_s = 30
linger_s = 10
"""


def test_di_round_trip_through_the_coordinator(tmp_path):
    path = tmp_path / "di.toml"
    path.write_text(SCENARIO)
    results, code = run_scenario(path, tmp_path / "run", progress=False, quiet=True)
    assert code == 0, results["summary"]
    coordinator = results["coordinator"]
    assert coordinator["status"] == "ok"
    assert [r["round"] for r in coordinator["rounds"]] == [1, 2]
    for r in coordinator["rounds"]:
        weights = r["weights"]
        assert sorted(weights) == ["node-0", "node-1", "node-2"]
        assert all(w >= 0 for w in weights.values())
        assert math.isclose(sum(weights.values()), 1.0, rel_tol=1e-6)
        assert 0.0 <= r["held_out_acc"] <= 1.0
    assert results["summary"]["held_out_acc"] == coordinator["rounds"][-1]["held_out_acc"]
    assert coordinator["held_out_domain"] == "synth"
    # Every node ends on the same global model, and the bytes it pulled are the model's size.
    run = tmp_path / "run"
    states = [
        load_checkpoint(run / "checkpoints" / f"{n['id']}.p2pfl", node_id=n["id"],
                        public_hex=NodeKey.load(run / "keys" / f"{n['id']}.key").public_hex)
        for n in results["nodes"]
    ]
    for other in states[1:]:
        for name, tensor in states[0].items():
            torch.testing.assert_close(other[name], tensor, rtol=0, atol=0)
    for n in results["nodes"]:
        for r in n["rounds"]:
            assert r["bytes_by_part"]["received"].get("global", 0) > 0
            assert r["bytes_by_part"]["sent"].get("full", 0) > 0  # the stats push carries the trained state
            assert r["strategy"].get("xi") is not None


def test_a_live_member_kept_out_of_a_round_is_waited_for_again_and_named(tmp_path):
    """Review finding 1 of issue 48: Before, a node whose submission did not arrive in a round (its pushes refused while another
    member filled the coordinator's budget) was never waited for again, and the run ended "ok".
    Now the coordinator asks whether it is still live: it is waited for in the next rounds, the
    round records it under `missing_live`, and the coordinator ends "degraded"."""
    from p2pfl.runtime.strategy import COORDINATOR_ID

    from .helpers import build_in_process, run_in_process, write_tiny

    path = write_tiny(tmp_path, nodes=3, rounds=4, samples=40, algorithm="fedavg_global")
    nodes, coordinator = build_in_process(path, tmp_path / "run", ("runtime.straggler_wait_s=3",))
    assert coordinator is not None
    starved = nodes[2].transport
    push = starved.push

    async def kept_out_in_round_2(target, *, round_, **kwargs):
        if target == COORDINATOR_ID and round_ == 2:
            return False  # as a push refused with 429 until it gave up
        return await push(target, round_=round_, **kwargs)

    starved.push = kept_out_in_round_2
    results, coord, _ = run_in_process(nodes, coordinator)
    assert [r["status"] for r in results] == ["ok"] * 3
    rounds = {x["round"]: x for x in coord["rounds"]}
    assert rounds[2]["missing"] == ["node-2"] and rounds[2]["missing_live"] == ["node-2"]
    assert rounds[3]["submitted"] == rounds[4]["submitted"] == ["node-0", "node-1", "node-2"]  # waited for again
    assert coord["status"] == "degraded" and "[2]" in coord["error"]
    # Its round records say what a node's do of every round (round, bytes, wall_s, started_at).
    node_round = results[0]["rounds"][1]
    assert {"round", "bytes_sent", "bytes_received", "wall_s", "started_at"} <= set(rounds[2]) & set(node_round)
    assert node_round["started_at"] <= rounds[2]["started_at"] + rounds[2]["wall_s"]


def test_the_coordinator_exits_as_a_node_does_and_non_zero_when_degraded() -> None:
    """One exit-status rule for both (2 not started, 130 interrupted, 1 ended badly); a node's
    "degraded" (rounds with nothing from peers) exits 0, the coordinator's (a live member kept
    out: docs/security.md, attack 1) exits 1."""
    from p2pfl.runtime.status import COORDINATOR_ENDED_BADLY, exit_status

    for ended_badly in (None, COORDINATOR_ENDED_BADLY):
        rule = (lambda rs: exit_status(rs)) if ended_badly is None else (lambda rs: exit_status(rs, ended_badly))
        assert rule([{"status": "ok"}]) == 0 and rule([{}]) == 2 and rule([{"status": "interrupted"}]) == 130
        assert rule([{"status": "failed"}]) == rule([{"status": "revoked"}]) == 1
    assert exit_status([{"status": "degraded"}]) == 0
    assert exit_status([{"status": "degraded"}], COORDINATOR_ENDED_BADLY) == 1
