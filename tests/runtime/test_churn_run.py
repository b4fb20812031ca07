"""A scenario with churn run by the launcher: the membership timeline in results.json follows the
schedule, and the same seed and schedule give the same timeline."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from p2pfl.models import part_state
from p2pfl.report.folders import make_report
from p2pfl.runtime.churn import scripts_of
from p2pfl.runtime.node.round import Round
from p2pfl.runtime.config import node_ids
from p2pfl.scenario.launcher import run_scenario
from p2pfl.scenario.results import format_summary
from p2pfl.scenario.schema import load_scenario

from .helpers import build_in_process, run_in_process, write_tiny

CHURN = ['runtime.placement="shared"', "runtime.workers=1", 'runtime.topology="ring"', "runtime.linger_s=5",
         "churn.join=[{node = 4, round = 3}]", "churn.leave=[{node = 2, round = 4}]",
         "churn.crash=[{node = 1, round = 2, restart = 4}]"]


@pytest.mark.slow
def test_the_timeline_follows_the_schedule_and_the_same_seed_gives_the_same_one(tmp_path: Path) -> None:
    path = write_tiny(tmp_path, nodes=5, rounds=5, samples=40, timeout=60.0)
    timelines = []
    for name in ("a", "b"):
        results, code = run_scenario(path, tmp_path / name, CHURN, progress=False, quiet=True)
        assert code == 0, [(n["id"], n["status"], n.get("error")) for n in results["nodes"]]
        timelines.append(results["membership"])
    assert timelines[0] == timelines[1]
    scenario = load_scenario(path, CHURN)
    scripts = scripts_of(scenario.churn, 5, 5, scenario.seed)
    ids = node_ids(5)
    for entry in timelines[0]:
        r = entry["round"]
        assert entry["live"] == [ids[i] for i in range(5) if scripts[i].live_in(r)], entry
    by_round = {e["round"]: e for e in timelines[0]}
    assert by_round[3]["joined"] == [ids[4]] and by_round[4]["left"] == [ids[2]]
    assert by_round[2]["crashed"] == [ids[1]] and by_round[4]["restarted"] == [ids[1]]
    by_id = {n["id"]: n for n in results["nodes"]}
    assert {nid: n["status"] for nid, n in by_id.items()} == {
        ids[0]: "degraded", ids[1]: "ok", ids[2]: "left", ids[3]: "ok", ids[4]: "ok"}
    # node-0's ring neighbours in round 2: node-1 had crashed, node-4 had not joined: it learned from no one.
    assert by_id[ids[0]]["rounds_alone"] == [2]
    assert any(p.name == "membership.png" for p in make_report(tmp_path / "a"))
    # The summary says that neighbours changed: who a node learned from is not the topology's alone.
    replaced = sum(len((r.get("neighbours") or {}).get("replaced") or {}) for n in results["nodes"] for r in n["rounds"])
    summary = format_summary(results)
    assert (f"neighbours replaced {replaced} times" in summary) == (replaced > 0)


@pytest.mark.slow
def test_a_member_away_every_other_round_costs_the_others_no_round(tmp_path: Path) -> None:
    """Issue 63: node-2 says goodbye before rounds 2 and 4 and is back by its signed word in 3 and
    5. Its ring neighbours do not wait for it in its away rounds (no part waited for and not got),
    every other node runs every round, and in its rounds it is heard again."""
    path = write_tiny(tmp_path, nodes=5, rounds=5, samples=40, timeout=60.0)
    flap = [*CHURN[:4], "churn.flap=[{node = 2, round = 2}]"]
    results, code = run_scenario(path, tmp_path / "run", flap, progress=False, quiet=True)
    assert code == 0, [(n["id"], n["status"], n.get("error")) for n in results["nodes"]]
    ids = node_ids(5)
    by_id = {n["id"]: n for n in results["nodes"]}
    assert [r["round"] for r in by_id[ids[2]]["rounds"]] == [1, 3, 5]
    assert [(e["round"], e["event"]) for e in by_id[ids[2]]["membership"]] == [
        (2, "stepped_out"), (3, "stepped_back"), (4, "stepped_out"), (5, "stepped_back")]
    timeline = {e["round"]: e for e in results["membership"]}  # the run's timeline marks both
    assert [r for r in timeline if ids[2] in timeline[r]["stepped_out"]] == [2, 4]
    assert [r for r in timeline if ids[2] in timeline[r]["stepped_back"]] == [3, 5]
    others = [by_id[i] for i in ids if i != ids[2]]
    assert all(n["status"] == "ok" and [r["round"] for r in n["rounds"]] == [1, 2, 3, 4, 5] for n in others)
    assert sum(r["unanswered"] for n in others for r in n["rounds"]) == 0
    took = {(n["id"], r["round"]) for n in others for r in n["rounds"] if ids[2] in (r.get("arrived") or [])}
    assert not {r for _, r in took} & {2, 4}  # nothing of it in its away rounds, and nobody waited
    assert {r for _, r in took} & {3, 5}  # heard again in its rounds
    departed = {n["id"] for n in others for r in n["rounds"] if ids[2] in (r.get("neighbours") or {}).get("departed", [])}
    assert {ids[1], ids[3]} <= departed  # its ring neighbours took its goodbye


def test_a_coordinator_takes_the_members_that_submitted_and_a_joiner_starts_from_its_global_model(tmp_path: Path) -> None:
    """GA under churn: a node that joins in round 3 starts from the coordinator's global model of
    round 2 (the coordinator does not wait for it before); a node that crashes before round 2 is
    waited for once (straggler_wait_s) and taken back when it comes back in round 4; the
    coordinator aggregates who submitted. Each returning member is held back until the others
    have submitted its first round: the coordinator waits for it because it said it is back (its
    signed return), not because it happened to submit before the others (on a loaded machine it
    did not, and its round was refused as already aggregated)."""
    path = write_tiny(tmp_path, nodes=4, rounds=5, samples=40, algorithm="ga", timeout=60.0)
    nodes, coordinator = build_in_process(path, tmp_path / "run", (
        "runtime.straggler_wait_s=15.0", "churn.join=[{node = 3, round = 3}]",
        "churn.crash=[{node = 1, round = 2, restart = 4}]"))
    assert coordinator is not None
    globals_by_round: dict[int, dict] = {}
    publish = coordinator.publish

    async def recording(version, round_, reply):  # type: ignore[no-untyped-def]
        if "global" in reply.parts:
            globals_by_round[version] = {k: v.clone() for k, v in reply.parts["global"].items()}
        await publish(version, round_, reply)

    coordinator.publish = recording  # type: ignore[method-assign]
    at_first_round: dict = {}
    run = Round.run

    returns = {("node-3", 3): {"node-0", "node-2"}, ("node-1", 4): {"node-0", "node-2", "node-3"}}

    async def capturing(self: Round):  # type: ignore[no-untyped-def]
        if self.kit.ctx.node_id == "node-3" and not at_first_round:
            at_first_round.update({k: v.clone() for k, v in part_state(self.kit.parts.model, "full").items()})
        others = returns.get((self.kit.ctx.node_id, self.r))
        while others is not None and coordinator.round < self.r and not others <= set(coordinator.submissions.get(self.r, {})):
            await asyncio.sleep(0.01)  # a condition awaited: the others' submissions, or the round's end
        return await run(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Round, "run", capturing)
        results, coord, _ = run_in_process(nodes, coordinator)
    assert coord is not None and coord["status"] == "ok"
    by_id = {r["id"]: r for r in results}
    [joined] = by_id["node-3"]["membership"]
    assert joined == {**joined, "event": "joined", "round": 3, "from": "coordinator", "version": 2}
    assert all(torch.equal(at_first_round[k], globals_by_round[2][k]) for k in globals_by_round[2])
    assert [r["round"] for r in by_id["node-3"]["rounds"]] == [3, 4, 5]
    assert [r["round"] for r in by_id["node-1"]["rounds"]] == [1, 4, 5]
    submitted = {r["round"]: r["submitted"] for r in coord["rounds"]}
    assert submitted[1] == ["node-0", "node-1", "node-2"] and submitted[2] == ["node-0", "node-2"]
    assert submitted[3] == ["node-0", "node-2", "node-3"]
    assert submitted[4] == submitted[5] == ["node-0", "node-1", "node-2", "node-3"]


def test_a_client2vec_joiner_gets_its_index_before_its_first_round(tmp_path: Path) -> None:
    """Client2Vec's GLOBAL strategy under churn: the coordinator trains DSA-IGN on the batches of the
    nodes there at the start (not waiting for the one that joins in round 2); the joiner takes the
    same DSA-IGN from a neighbour, builds its own index with it and has its peers' indices before
    its first round, each equal to the index that peer built."""
    from p2pfl.algorithms.client2vec.index import IndexBuilding

    from .test_client2vec_run import SCENARIO

    path = tmp_path / "c2v.toml"
    path.write_text(SCENARIO.format(extra=""))
    nodes, coordinator = build_in_process(path, tmp_path / "run", ("rounds=3", "churn.join=[{node = 3, round = 2}]"))
    dsa_ign: dict[str, dict[str, torch.Tensor]] = {}
    built = IndexBuilding.global_dsa_ign

    def capturing(self, ctx, d, lab):  # type: ignore[no-untyped-def]
        model = built(self, ctx, d, lab)
        dsa_ign[ctx.node_id] = {k: v.clone() for k, v in model.state_dict().items()}
        return model

    at_first_round: dict[str, dict] = {}
    run = Round.run

    async def looking(self: Round):  # type: ignore[no-untyped-def]
        node = self.kit.ctx.node_id
        at_first_round.setdefault(node, {peer: index.full.clone() for peer, index in self.kit.parts.strategy.indices.items()})
        return await run(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(IndexBuilding, "global_dsa_ign", capturing)
        patch.setattr(Round, "run", looking)
        results, coord, _ = run_in_process(nodes, coordinator)
    by_id = {r["id"]: r for r in results}
    assert coord is not None and coord["setup"]["submitted"] == ["node-0", "node-1", "node-2"]
    assert all(r["status"] == "ok" for r in results), [(r["id"], r["status"], r["error"]) for r in results]
    assert [r["round"] for r in by_id["node-3"]["rounds"]] == [2, 3]
    reference = dsa_ign["node-0"]
    for node in ("node-1", "node-2", "node-3"):  # one DSA-IGN: the joiner's is the coordinator's too
        assert all(torch.equal(dsa_ign[node][k], reference[k]) for k in reference)
    joiner = at_first_round["node-3"]
    assert set(joiner) == {"node-0", "node-1", "node-2", "node-3"}
    for peer in ("node-0", "node-1", "node-2"):
        assert torch.allclose(joiner[peer], at_first_round[peer][peer])
