"""What a node refuses of a version or a checkpoint that cannot be right (issue 30's findings): a
peer's version served from past the last round, a `--resume` with no checkpoint to resume."""

from __future__ import annotations

import asyncio
from pathlib import Path

from p2pfl.models import part_state
from p2pfl.runtime.devices import host_snapshot
from p2pfl.runtime.node.intake import RoundChecks
from p2pfl.runtime.strategy import Fetch
from p2pfl.wire import NodeKey

from .helpers import build_in_process, lone_node, scenario_of, write_tiny


def test_a_served_version_past_the_last_round_is_refused_not_aggregated_as_fresh(tmp_path: Path) -> None:
    """A peer serving version 2**62 was taken as the freshest model every round."""
    nodes, _ = build_in_process(write_tiny(tmp_path, nodes=2, rounds=2, samples=40, timeout=3.0), tmp_path / "run")
    victim, liar = nodes
    got: list = []
    checks = RoundChecks(1)

    async def scenario() -> None:
        await liar.transport.start(liar.config.host, liar.config.port)
        await victim.transport.start(victim.config.host, victim.config.port)
        try:
            await liar.transport.publish(2**62, 2**62, {"full": host_snapshot(part_state(liar.model, "full"))},
                                        {"n_train": len(liar.parts.data.train)})
            got.extend(await victim.exchange.gather([Fetch(liar.config.id, "full")], 1, checks))
        finally:
            await victim.transport.close()
            await liar.transport.close()

    asyncio.run(scenario())
    assert got == []
    assert "served version 4611686018427387904" in checks.refused["node-1"]


def test_a_resume_without_a_checkpoint_fails_at_once_and_writes_none(tmp_path: Path) -> None:
    """Before, it waited start_wait_s, failed with a traceback, and wrote a round-0 checkpoint,
    so the next --resume silently started over."""
    from p2pfl.assembly import assemble_node

    node = lone_node(tmp_path, NodeKey.generate())
    resumed = assemble_node(node.config, scenario_of(node), resume=True)
    result = asyncio.run(asyncio.wait_for(resumed.run(), timeout=node.settings.start_wait_s - 1))
    assert result["status"] == "failed" and result["error"].startswith("--resume: no checkpoint at")
    assert "Traceback" not in result["error"]
    assert not resumed.state.path.exists()
