"""Issue 67, item 5: a resumed run's progress starts where its nodes were, and its start-up is
the time to its first round after the launch, not 0."""

from __future__ import annotations

import json
from pathlib import Path

from p2pfl.runtime.run_folder import RunFolder
from p2pfl.scenario.launcher import rounds_recorded


def test_a_resumed_runs_bar_starts_at_the_node_rounds_already_recorded(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    for nid, rounds in (("node-0", [1, 2, 3, 3]), ("node-1", [1, 2])):  # node-0 replayed round 3
        for r in rounds:
            folder.append_round(nid, {"round": r})
    paths = [tmp_path / "nodes" / f"{n}.toml" for n in ("node-0", "node-1", "node-2")]
    assert rounds_recorded(tmp_path, paths) == 3 + 2 + 0


def test_start_up_of_a_resumed_run_counts_from_its_launch(tmp_path: Path) -> None:
    from p2pfl.scenario.results import write_results
    from p2pfl.scenario.schema import load_scenario

    from .helpers import write_tiny

    scenario = load_scenario(write_tiny(tmp_path, nodes=2, rounds=4, samples=40))
    folder = RunFolder(tmp_path / "run")
    (tmp_path / "run" / "nodes").mkdir(parents=True)
    launch = 1000.0
    for nid in ("node-0", "node-1"):  # rounds 1-2 before the interruption, 3-4 after the resume at `launch`
        rounds = [{"round": r, "started_at": launch - 500 + r if r <= 2 else launch + 3.5 + r, "test_acc": 0.5}
                  for r in (1, 2, 3, 4)]
        folder.node_result(nid).write_text(json.dumps({"id": nid, "status": "ok", "rounds": rounds,
                                                       "final_test_acc": 0.5}))
    results = write_results(scenario, tmp_path / "run", {}, 10.0, {}, started_at=launch)
    assert results["summary"]["startup_s"] == 6.5  # before: max(0, 501 - 1000) = 0.0


def test_a_cancelled_node_stops_its_companions_too(tmp_path: Path) -> None:
    """Issue 67, item 9: SIGTERM of a federation member (its task cancelled) left the gossip's
    HTTP session open: aiohttp printed "Unclosed client session / connector" at exit."""
    import asyncio
    import dataclasses

    from p2pfl.wire import NodeKey

    from .helpers import lone_node

    node = lone_node(tmp_path, NodeKey.generate())
    said: list[str] = []

    class Companion:
        name = "watch"

        async def start(self, node: object) -> None:
            said.append("started")

        async def stop(self) -> None:
            said.append("stopped")

    node.parts = dataclasses.replace(node.parts, companions=(Companion(),))

    async def scenario() -> None:
        task = asyncio.create_task(node.run())
        while not said:  # until it has started its companion (it then waits for its peer)
            await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(asyncio.wait_for(scenario(), 60))
    assert said == ["started", "stopped"]
