"""A peer that ran ahead still serves the round a slower node asks for: a read for version R gets
the earliest version >= R the peer holds (the versions that fit in `runtime.held_mb`), so which
model a node aggregates does not depend on timing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from p2pfl.assembly import assemble_node
from p2pfl.models import part_state
from p2pfl.runtime.node.intake import RoundChecks
from p2pfl.runtime.config import load_node_config
from p2pfl.runtime.devices import host_snapshot
from p2pfl.runtime.transport.stores import published_bytes
from p2pfl.scenario.launcher import write_run_folder
from p2pfl.scenario.schema import load_scenario

from .helpers import write_tiny


def test_a_read_gets_the_earliest_held_version_at_or_after_the_one_asked_for(tmp_path: Path) -> None:
    scenario = load_scenario(write_tiny(tmp_path, nodes=2, samples=40, timeout=5.0))
    paths, _ = write_run_folder(scenario, tmp_path / "run")
    ahead, behind = (assemble_node(load_node_config(p), scenario) for p in paths)
    held, published = 3, 5  # room for three versions: 1 and 2 are dropped

    def state_of(version: int) -> dict[str, torch.Tensor]:
        return host_snapshot({k: torch.full_like(v, float(version)) for k, v in part_state(ahead.model, "full").items()})

    async def scenario_() -> dict[int, tuple[int, float]]:
        await ahead.transport.start(ahead.config.host, ahead.config.port)
        await behind.transport.start(behind.config.host, behind.config.port)
        try:
            for version in range(1, published + 1):
                await ahead.transport.publish(version, version, {"full": state_of(version)}, {"n_train": 5})
                if version == 1:
                    assert ahead.transport.store.latest is not None
                    ahead.transport.store.held_bytes = held * published_bytes(ahead.transport.store.latest)
            assert [p.version for p in ahead.transport.store.recent] == [3, 4, 5]
            got = {}
            for asked in range(1, published + 2):
                message = await behind.transport.fetch(ahead.config.id, "full", asked, timeout=0.5)
                assert message is not None, asked
                tensors = behind.exchange.intake.peer_model(message, RoundChecks(asked)).tensors
                got[asked] = (message.header.version, float(next(iter(tensors.values())).flatten()[0]))
            return got
        finally:
            await ahead.transport.close()
            await behind.transport.close()

    got = asyncio.run(scenario_())
    oldest_held = published - held + 1
    for asked, (version, value) in got.items():
        if asked <= oldest_held:
            assert version == oldest_held  # dropped versions: the earliest held instead
        elif asked <= published:
            assert version == asked  # held: exactly the version asked for, not the newest
        else:
            assert version == published  # none newer yet: the latest, a stale answer after the wait
        assert value == float(version)  # the body served is that version's


def test_the_latest_version_is_served_whatever_the_room() -> None:
    from p2pfl.runtime.transport.stores import PartStore, Published
    from p2pfl.wire.body import encode_body

    async def scenario_() -> list[int]:
        store = PartStore(held_bytes=0)  # runtime.held_mb = 0: the latest only, as before versions were held
        for version in (1, 2):
            await store.publish(Published(version, version, {"full": encode_body({"w": torch.ones(4)})}, {}))
        return [p.version for p in store.recent] + [store.held(1).version]  # type: ignore[union-attr]

    assert asyncio.run(scenario_()) == [2, 2]


def test_a_negative_held_mb_names_the_field(tmp_path: Path) -> None:
    import pytest

    from p2pfl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"runtime\.held_mb"):
        load_scenario(write_tiny(tmp_path), ["runtime.held_mb=-1"])


def test_first_difference_finds_the_round_two_runs_part_in_and_ignores_bytes() -> None:
    from p2pfl.scenario.results import first_difference

    def run(acc_node_1_round_2: float, bytes_node_0: int = 10) -> dict:
        rounds = lambda nid: [{"round": r, "test_acc": acc_node_1_round_2 if (nid, r) == (1, 2) else 0.5,
                               "arrived": ["node-0"], "bytes_sent": bytes_node_0 if nid == 0 else 10}
                              for r in (1, 2, 3)]
        return {"nodes": [{"id": f"node-{i}", "rounds": rounds(i)} for i in (0, 1)]}

    assert first_difference(run(0.5), run(0.5, bytes_node_0=99)) is None  # bytes land where reads arrive
    assert first_difference(run(0.5), run(0.7)) == (2, ["node-1"])
    shorter = run(0.5)
    shorter["nodes"][0]["rounds"].pop()
    assert first_difference(run(0.5), shorter) == (3, ["node-0"])


def test_a_version_every_reader_has_read_past_is_dropped_and_one_a_reader_may_still_ask_for_is_kept() -> None:
    from p2pfl.runtime.transport.stores import PartStore, Published
    from p2pfl.wire.body import encode_body

    async def scenario_() -> list[list[int]]:
        store = PartStore()
        store.readers = frozenset({"a", "b"})
        seen = []
        for version in (1, 2, 3):
            await store.publish(Published(version, version, {"full": encode_body({"w": torch.ones(4)})}, {}))
        store.note_read("a", 3)
        seen.append([p.version for p in store.recent])  # b has not asked: it may still ask for round 1
        store.note_read("b", 2)
        seen.append([p.version for p in store.recent])  # nobody asks below 2 again
        seen.append([store.held(2).version])  # type: ignore[union-attr]  # b's next read: the same version as before
        store.forget_reader("b")  # b said goodbye: only a's reads count
        store.note_read("a", 4)
        seen.append([p.version for p in store.recent])  # the latest always stays
        return seen

    assert asyncio.run(scenario_()) == [[1, 2, 3], [2, 3], [2], [3]]


def test_a_version_answered_in_full_to_every_reader_goes_before_they_ask_for_the_next() -> None:
    """Issue 66: at 10,000 nodes each node's round-1 version waited for its slowest neighbour's
    ask of round 2. A reader whose read was answered asks for that round no more."""
    from p2pfl.runtime.transport.stores import PartStore, Published
    from p2pfl.wire.body import encode_body

    async def scenario_() -> list[list[int]]:
        store = PartStore()
        store.readers = frozenset({"a", "b"})
        seen = []
        for version in (1, 2):
            await store.publish(Published(version, version, {"full": encode_body({"w": torch.ones(4)})}, {}))
        store.note_read("a", 1)
        store.note_answered("a", 1, "full")
        store.note_read("b", 1)  # asked, not answered yet (still waiting, or the answer broke off)
        seen.append([p.version for p in store.recent])
        store.note_answered("b", 1, "full")
        seen.append([p.version for p in store.recent])  # nobody will ask for round 1 again
        store.note_read("b", 1)  # an ask of an older round never lowers what was noted
        seen.append([p.version for p in store.recent])
        # A version of two parts: a reader answered one of them may still read the other.
        two = PartStore()
        two.readers = frozenset({"a"})
        for version in (1, 2):
            body = encode_body({"w": torch.ones(4)})
            await two.publish(Published(version, version, {"body": body, "head": body}, {}))
        two.note_read("a", 1)
        two.note_answered("a", 1, "body")
        seen.append([p.version for p in two.recent])
        return seen

    assert asyncio.run(scenario_()) == [[1, 2], [2], [2], [1, 2]]


@pytest.mark.parametrize("carrier", ["http", "loopback"])
def test_each_read_a_carrier_sends_in_full_is_noted_as_answered(tmp_path: Path, carrier: str) -> None:
    """Both carriers tell the store of every read they sent whole: two readers a node, two rounds."""
    from .helpers import build_in_process, run_in_process, write_tiny

    path = write_tiny(tmp_path, nodes=3, rounds=2, samples=40)
    nodes, _ = build_in_process(path, tmp_path / "run", overrides=(
        'runtime.placement="shared"', "runtime.workers=1", f'runtime.transport="{carrier}"'))
    answered: dict[str, list[tuple[str, int]]] = {n.config.id: [] for n in nodes}
    for node in nodes:
        store, note = node.transport.store, node.transport.store.note_answered
        store.note_answered = lambda reader, version, part, note=note, seen=answered[node.config.id]: (  # type: ignore[method-assign]
            seen.append((reader, version)), note(reader, version, part))[1]
    results, _, _ = run_in_process(nodes, None)
    assert all(r["status"] == "ok" for r in results)
    for node_id, seen in answered.items():
        readers = sorted({f"node-{i}" for i in range(3)} - {node_id})
        assert sorted(seen) == sorted((reader, r) for reader in readers for r in (1, 2)), (node_id, seen)


def test_without_declared_readers_nothing_is_dropped_early() -> None:
    from p2pfl.runtime.transport.stores import PartStore, Published
    from p2pfl.wire.body import encode_body

    async def scenario_() -> list[int]:
        store = PartStore()
        for version in (1, 2, 3):
            await store.publish(Published(version, version, {"full": encode_body({"w": torch.ones(4)})}, {}))
        store.note_read("a", 3)
        return [p.version for p in store.recent]

    assert asyncio.run(scenario_()) == [1, 2, 3]
