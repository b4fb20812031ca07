"""Nodes that join, leave, crash and come back while the others keep learning: whole node lives
(`Node.run`) on one event loop, built in code. Every wait that churn could cost is set far above
what a round takes (fetch_timeout_s = 60 s), so a wait paid shows as a round of a minute."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from p2pfl.models import part_state
from p2pfl.runtime.churn import NodeScript
from p2pfl.runtime.node import Node
from p2pfl.runtime.node.round import Round

from .kit import SETTINGS, code_nodes

RING = [[1, 3], [0, 2], [1, 3], [2, 0]]  # four nodes, two neighbours each
SLOW_WAIT_S = 60.0
PATIENT = dataclasses.replace(SETTINGS, fetch_timeout_s=SLOW_WAIT_S, start_wait_s=SLOW_WAIT_S)


def run_all(nodes: list[Node]) -> list[dict[str, Any]]:
    async def everything() -> list[dict[str, Any]]:
        return list(await asyncio.gather(*(n.run() for n in nodes)))

    return asyncio.run(everything())


def exchange_seconds(result: dict[str, Any]) -> list[float]:
    return [r["time"]["exchange_s"] for r in result["rounds"]]


def assert_no_wait_paid(results: list[dict[str, Any]]) -> None:
    """No round of any node waited anything like fetch_timeout_s for a peer that was gone."""
    for result in results:
        assert max(exchange_seconds(result), default=0.0) < SLOW_WAIT_S / 4, (result["id"], exchange_seconds(result))


def test_a_node_that_joins_mid_run_starts_from_its_neighbours_newest_model(tmp_path: Path) -> None:
    scripts = [NodeScript(), NodeScript(), NodeScript(join=3)]
    nodes = code_nodes(tmp_path, 3, [[1, 2], [0, 2], [0, 1]], settings=PATIENT, scripts=scripts)
    published: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
    for node in nodes[:2]:
        publish = node.transport.publish

        async def recording(version: int, round_: int, parts: Any, meta: Any, *rest: Any, _publish: Any = publish,
                            _id: str = node.config.id) -> None:
            published[(_id, version)] = {k: v.clone() for k, v in parts["full"].items()}
            await _publish(version, round_, parts, meta, *rest)

        node.transport.publish = recording  # type: ignore[method-assign]
    at_first_round: dict[str, torch.Tensor] = {}
    run = Round.run

    async def capturing(self: Round) -> Any:
        if self.kit.ctx.node_id == "node-2" and not at_first_round:
            at_first_round.update({k: v.clone() for k, v in part_state(self.kit.parts.model, "full").items()})
        return await run(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Round, "run", capturing)
        results = run_all(nodes)
    joiner = results[2]
    assert [r["round"] for r in joiner["rounds"]] == [3, 4]
    [joined] = joiner["membership"]
    assert joined["event"] == "joined" and joined["round"] == 3 and joined["version"] == 2
    taken = published[(joined["from"], joined["version"])]
    assert set(taken) == set(at_first_round)
    assert all(torch.equal(at_first_round[k], taken[k]) for k in taken), "the joiner trained on from another model"
    # Its neighbours did not wait for it before it joined, and took its parts after.
    for result in results[:2]:
        assert [r["round"] for r in result["rounds"]] == [1, 2, 3, 4]
        assert all("node-2" not in r["arrived"] for r in result["rounds"][:2])
        assert "node-2" in result["rounds"][3]["arrived"]
    assert_no_wait_paid(results)


def test_a_goodbye_costs_no_timeout_and_the_neighbour_is_replaced(tmp_path: Path) -> None:
    scripts = [NodeScript(), NodeScript(), NodeScript(leave=2), NodeScript()]
    results = run_all(code_nodes(tmp_path, 4, RING, settings=PATIENT, scripts=scripts))
    assert results[2]["status"] == "left" and [r["round"] for r in results[2]["rounds"]] == [1]
    assert results[2]["membership"][0]["event"] == "left"
    for i in (1, 3):  # node-2's neighbours: each takes a stand-in from the rest of the roster
        result = results[i]
        assert result["status"] == "ok" and [r["round"] for r in result["rounds"]] == [1, 2, 3, 4]
        changes = [r["neighbours"] for r in result["rounds"] if r.get("neighbours")]
        assert changes and changes[0]["departed"] == ["node-2"]
        stand_in = changes[0]["replaced"]["node-2"]
        assert stand_in not in ("node-2", result["id"])
        assert stand_in in result["rounds"][-1]["arrived"] and result["rounds"][-1]["unanswered"] == 0
    assert_no_wait_paid(results)


def test_a_crashed_node_costs_its_neighbours_no_timeout_and_rejoins_where_they_are(tmp_path: Path) -> None:
    """A crash closes the port (refused at once) and says nothing; the node comes back from its
    checkpoint and runs the round its neighbours are in; its neighbours take it back."""
    scripts = [NodeScript(), NodeScript(crash=2, restart=4), NodeScript(), NodeScript()]
    settings = dataclasses.replace(PATIENT, rounds=5)
    results = run_all(code_nodes(tmp_path, 4, RING, settings=settings, scripts=scripts))
    crashed = results[1]
    assert crashed["status"] == "ok"
    events = {e["event"]: e for e in crashed["membership"]}
    assert events["crashed"]["round"] == 2 and events["restarted"]["after_round"] == 1
    back = events["restarted"]["round"]
    assert back >= 4 and [r["round"] for r in crashed["rounds"]] == [1, *range(back, 6)]
    for i in (0, 2):  # its neighbours: it was missing, then asked again and answered
        rounds = results[i]["rounds"]
        assert "node-1" not in rounds[1]["arrived"]  # round 2: it had crashed
        assert "node-1" in rounds[-1]["arrived"]
        assert results[i]["status"] == "ok"
    assert_no_wait_paid(results)


def test_a_departed_node_is_never_asked_again_and_its_later_messages_are_refused(tmp_path: Path) -> None:
    a, b = code_nodes(tmp_path, 2, [[1], [0]])
    state = {k: v.clone() for k, v in part_state(b.model, "full").items()}

    async def scenario() -> tuple[bool, Any]:
        for node in (a, b):
            await node.transport.start(node.config.host, node.config.port)
        try:
            await b.transport.say_goodbye([a.config.id], "leaving", before_round=1)
            pushed = await b.transport.push(a.config.id, kind="model", part="full", round_=1, version=1,
                                            tensors=state, meta={"n_train": 24}, timeout=2.0)
            fetched = await a.transport.fetch(b.config.id, "full", 1, timeout=2.0)
            return pushed, fetched
        finally:
            for node in (a, b):
                await node.transport.close()

    pushed, fetched = asyncio.run(scenario())
    assert pushed is False and fetched is None
    assert ("node-1", 410, "departed") in set(a.transport.rejections.counts)
    assert "node-1" in a.neighbours.departed and "node-1" not in a.neighbours.asked


def test_a_node_started_by_hand_while_the_federation_runs_joins_where_it_is(tmp_path: Path) -> None:
    """`p2pfl node --join`: not in any schedule; started once its neighbours are in round 3, it
    takes a neighbour's newest model and runs the round they are in, and they take it in."""
    # Not in a schedule, it is waited for at the start like any peer: start_wait_s, 1 s here.
    settings = dataclasses.replace(PATIENT, rounds=6, start_wait_s=1.0)
    nodes = code_nodes(tmp_path, 3, [[1, 2], [0, 2], [0, 1]], settings=settings, joining=[2])

    async def everything() -> list[dict[str, Any]]:
        first = [asyncio.ensure_future(n.run()) for n in nodes[:2]]
        while nodes[0].round < 3:  # the federation is running when the third node starts
            await asyncio.sleep(0.01)
        return list(await asyncio.gather(*first, nodes[2].run()))

    results = asyncio.run(everything())
    joiner = results[2]
    [joined] = joiner["membership"]
    assert joined["event"] == "joined" and joined["round"] >= 3 and joined["from"] in ("node-0", "node-1")
    assert [r["round"] for r in joiner["rounds"]] == list(range(joined["round"], 7))
    for result in results[:2]:
        assert result["status"] == "ok" and "node-2" in result["rounds"][-1]["arrived"]
    assert_no_wait_paid(results)


def test_events_at_a_time_join_leave_crash_and_come_back(tmp_path: Path) -> None:
    """`second = t` instead of `round = r`: at a time from the node's start. A node joining at a
    time has its port closed until then (as a process not started) and runs the round its
    neighbours are in; one leaving at a time says goodbye before its next round; one crashing at
    a time comes back `restart_after_s` later, where its neighbours are. Thirty rounds last
    seconds; every event here falls in the first half second."""
    scripts = [NodeScript(), NodeScript(crash_s=0.2, restart_after_s=0.3), NodeScript(join_s=0.3),
               NodeScript(leave_s=0.4), NodeScript()]
    mesh = [[j for j in range(5) if j != i] for i in range(5)]
    results = run_all(code_nodes(tmp_path, 5, mesh, settings=dataclasses.replace(PATIENT, rounds=30), scripts=scripts))
    crashed, joiner, leaver = results[1], results[2], results[3]
    kinds = [e["event"] for e in crashed["membership"]]
    assert kinds == ["crashed", "restarted"] and crashed["status"] == "ok"
    back = crashed["membership"][1]["round"]
    assert [r["round"] for r in crashed["rounds"]][-(31 - back):] == list(range(back, 31))
    [joined] = joiner["membership"]
    assert joined["event"] == "joined" and joined["round"] >= 2
    assert [r["round"] for r in joiner["rounds"]] == list(range(joined["round"], 31))
    assert leaver["status"] == "left" and len(leaver["rounds"]) < 30
    assert leaver["membership"][0]["round"] == leaver["rounds"][-1]["round"] + 1
    for result in (results[0], results[4]):
        assert result["status"] == "ok" and len(result["rounds"]) == 30
        assert {"node-1", "node-2"} <= set(result["rounds"][-1]["arrived"]) and "node-3" not in result["rounds"][-1]["arrived"]
    assert_no_wait_paid(results)


def test_a_strategy_that_shares_nothing_joins_and_comes_back_by_round_alone(tmp_path: Path) -> None:
    from p2pfl.runtime.strategy import Strategy

    class Alone(Strategy):  # Local's shape: trains, shares nothing, fetches nothing
        shared_parts = ()

    scripts = [NodeScript(), NodeScript(crash=2, restart=3), NodeScript(join=3)]
    nodes = code_nodes(tmp_path, 3, [[1, 2], [0, 2], [0, 1]], settings=dataclasses.replace(PATIENT, rounds=4),
                       scripts=scripts, strategy=Alone(), fresh_strategy=Alone)
    results = run_all(nodes)
    assert [r["round"] for r in results[2]["rounds"]] == [3, 4] and results[2]["membership"][0]["from"] is None
    assert [r["round"] for r in results[1]["rounds"]][0] == 1 and results[1]["membership"][1]["event"] == "restarted"
    assert all(r["status"] == "ok" for r in results)


def test_joins_and_departures_spread_as_news_beyond_the_neighbours_told(tmp_path: Path) -> None:
    """A ring of six: node-5 joins in round 2 and node-2 leaves before round 5. node-2's goodbye
    goes to its two neighbours only; the nodes further away hear of it with the parts they fetch,
    as its own signed statement relayed verbatim (as they heard of node-5's join), and take it as
    final: node-2 is departed everywhere, told or not; its neighbours draw stand-ins."""
    ring = [[(i - 1) % 6, (i + 1) % 6] for i in range(6)]
    scripts = [NodeScript()] * 6
    scripts[5], scripts[2] = NodeScript(join=2), NodeScript(leave=5)
    settings = dataclasses.replace(PATIENT, rounds=7)
    nodes = code_nodes(tmp_path, 6, ring, settings=settings, scripts=scripts)
    results = run_all(nodes)
    assert results[2]["status"] == "left"
    goodbye = nodes[1].transport.goodbyes["node-2"]
    assert goodbye.event == -5
    for far in (0, 4, 5):  # not node-2's neighbours: never told, they heard its own word
        assert "node-2" not in nodes[far].transport.departed
        assert "node-2" in nodes[far].neighbours.departed, far
        assert nodes[far].neighbours.statements["node-2"][0].text == goodbye.text
    for near in (1, 3):
        assert nodes[near].transport.departed.keys() == {"node-2"}  # told, signed
        changes = [r["neighbours"] for r in results[near]["rounds"] if r.get("neighbours")]
        [(gone, stand_in)] = changes[0]["replaced"].items()
        assert gone == "node-2" and stand_in not in ("node-2", f"node-{near}")
        assert stand_in in results[near]["rounds"][-1]["arrived"]
    assert "node-5" in nodes[3].neighbours.heard_live  # two hops from the joiner
    assert all(r["status"] == "ok" for i, r in enumerate(results) if i != 2)
    assert_no_wait_paid(results)
