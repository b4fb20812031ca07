"""A node that fails says goodbye: nobody waits `fetch_timeout_s` for it, and a run whose
nodes all failed ends within seconds. Nodes run in this process so that a failure can be
injected into one of them; everything between them is real HTTP on 127.0.0.1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from p2pfl.runtime.coordinator import Coordinator
from p2pfl.runtime.node import Node
from p2pfl.runtime.strategy import RoundContext

from .helpers import build_in_process, run_in_process, write_tiny

TIMEOUT_S = 60.0  # what a peer would wait for a silent node, each round


def _build(tmp_path: Path, algorithm: str, nodes: int, rounds: int) -> tuple[list[Node], Coordinator | None]:
    path = write_tiny(tmp_path, nodes=nodes, rounds=rounds, samples=40, algorithm=algorithm, timeout=TIMEOUT_S)
    return build_in_process(path, tmp_path / "run")


def _fail_in_round(node: Node, round_: int) -> None:
    fit = node.strategy.fit

    def failing_fit(ctx: RoundContext) -> Any:
        if ctx.round == round_:
            raise RuntimeError("Expected all tensors to be on the same device (injected)")
        return fit(ctx)

    node.strategy.fit = failing_fit  # type: ignore[method-assign]


def test_peers_stop_waiting_for_a_node_that_failed(tmp_path: Path) -> None:
    nodes, _ = _build(tmp_path, "fedavg", nodes=3, rounds=3)
    _fail_in_round(nodes[1], 2)
    results, _, wall = run_in_process(nodes, None)
    by_id = {r["id"]: r for r in results}
    assert by_id["node-1"]["status"] == "failed" and "injected" in by_id["node-1"]["error"]
    for name in ("node-0", "node-2"):
        r = by_id[name]
        assert r["status"] == "ok" and [x["round"] for x in r["rounds"]] == [1, 2, 3]
        assert "node-1" not in r["rounds"][-1]["arrived"]
        # Without the goodbye each of rounds 2 and 3 would wait up to TIMEOUT_S for node-1.
        assert all(x["time"]["exchange_s"] < TIMEOUT_S / 4 for x in r["rounds"]), [x["time"] for x in r["rounds"]]
    assert wall < TIMEOUT_S


def test_a_run_whose_nodes_all_fail_ends_within_seconds(tmp_path: Path) -> None:
    nodes, coordinator = _build(tmp_path, "di", nodes=3, rounds=3)
    assert coordinator is not None
    for node in nodes:
        _fail_in_round(node, 1)
    results, coordinator_result, wall = run_in_process(nodes, coordinator)
    assert {r["status"] for r in results} == {"failed"}
    assert coordinator_result is not None and coordinator_result["rounds"] == []
    # The coordinator would otherwise wait 4 x fetch_timeout_s for round 1's statistics.
    assert wall < 20, wall


def test_withdrawing_ends_the_reads_waiting_on_a_failed_node_at_once() -> None:
    """Otherwise a peer's long-poll held the failed node's shutdown for its whole timeout."""
    import asyncio

    from p2pfl.runtime.transport.stores import PartStore

    async def scenario() -> tuple[object, float]:
        store = PartStore()
        loop = asyncio.get_running_loop()
        started = loop.time()
        waiting = asyncio.create_task(store.wait_for(5, timeout=30.0))
        await asyncio.sleep(0.05)
        await store.withdraw()
        return await asyncio.wait_for(waiting, 5.0), loop.time() - started

    published, seconds = asyncio.run(scenario())
    assert published is None and seconds < 1.0
