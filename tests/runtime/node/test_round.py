"""A round driven through its own seam: nodes built in code, a `Round` run on its own."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from p2pfl.models import part_state
from p2pfl.runtime.devices import host_snapshot
from p2pfl.runtime.node import Node, RoundRecord
from p2pfl.runtime.node.round import Round

from .kit import SETTINGS, code_nodes


async def _serving(nodes: list[Node]) -> None:
    for node in nodes:
        await node.transport.start(node.config.host, node.config.port)


async def _closing(nodes: list[Node]) -> None:
    for node in nodes:
        await node.transport.close()


def _published(node: Node) -> dict:
    return {"full": host_snapshot(part_state(node.model, "full"))}


def rounds_of(a: Node, b: Node, *rounds: int, sat_out: tuple[int, ...] = ()) -> list[RoundRecord]:
    """`a`'s records of `rounds` (those in `sat_out` sat out), while `b` serves its version 1 only."""
    async def scenario() -> list[RoundRecord]:
        await _serving([a, b])
        try:
            await b.transport.publish(1, 1, _published(b), {"n_train": 24})
            return [await (Round(a.kit, r).sit_out() if r in sat_out else Round(a.kit, r).run()) for r in rounds]
        finally:
            await _closing([a, b])

    return asyncio.run(scenario())


def test_a_round_built_in_code_takes_its_neighbours_part_and_records_it(tmp_path: Path) -> None:
    a, b = code_nodes(tmp_path, 2, [[1], [0]])
    [record] = rounds_of(a, b, 1)
    assert record.round == 1 and record.participated and record.asked == 1
    assert list(record.arrived) == ["node-1"] and not record.stale and not record.staleness
    assert record.strategy["arrivals"] == [["node-1", 1]]  # as JSON keeps it
    assert record.train_steps > 0 and 0.0 <= record.test_acc <= 1.0


def test_a_straggler_part_is_taken_stale_and_its_staleness_recorded(tmp_path: Path) -> None:
    """A peer that is two rounds behind (it published version 1 only) answers round 3's fetch
    with its newest version once the wait is over: taken (accept_stale), named, and two rounds old."""
    settings = dataclasses.replace(SETTINGS, fetch_timeout_s=0.3)
    a, b = code_nodes(tmp_path, 2, [[1], [0]], settings=settings)
    [record] = rounds_of(a, b, 3)
    assert list(record.stale) == ["node-1"] and dict(record.staleness) == {"node-1": 2}
    assert record.to_json()["staleness"] == {"node-1": 2}


def test_without_stale_parts_a_late_peer_is_not_taken(tmp_path: Path) -> None:
    settings = dataclasses.replace(SETTINGS, fetch_timeout_s=0.3, accept_stale=False)
    a, b = code_nodes(tmp_path, 2, [[1], [0]], settings=settings)
    [record] = rounds_of(a, b, 3)
    assert list(record.arrived) == [] and record.unanswered == 1


def test_a_sat_out_round_is_the_same_record_type_with_empty_exchange_fields(tmp_path: Path) -> None:
    a, b = code_nodes(tmp_path, 2, [[1], [0]])
    took, sat = rounds_of(a, b, 1, 2, sat_out=(2,))
    assert set(sat.to_json()) <= set(took.to_json())
    assert not sat.participated and sat.train_steps == 0 and sat.asked == 0 and list(sat.arrived) == []
    # Nothing changed the model since the round taken part in: the same scores, not scored again.
    assert sat.test_acc == took.test_acc_aggregated


def test_a_strategy_sets_each_rounds_training_and_evaluates_the_aggregate(tmp_path: Path) -> None:
    """Flower's per-round hooks, on every node: `fit_config` sets a round's training (here the
    learning rate decays and round 3 trains no epoch), `evaluate` scores the aggregate; the
    round's record keeps both, and the scenario's settings are back after the round."""
    import pytest

    from p2pfl.runtime.node.round import round_config
    from p2pfl.training.config import TrainConfig

    from .kit import AskEveryone

    seen: list[tuple[int, float, int]] = []

    class Scheduled(AskEveryone):
        def fit_config(self, ctx):  # type: ignore[no-untyped-def]
            return {"lr": 0.1 * 0.5 ** (ctx.round - 1), "epochs": 0 if ctx.round == 3 else 1}

        def fit(self, ctx):  # type: ignore[no-untyped-def]
            seen.append((ctx.round, ctx.trainer.config.lr, ctx.trainer.config.epochs))
            return super().fit(ctx)

        def evaluate(self, ctx):  # type: ignore[no-untyped-def]
            return {"val_acc_by_hook": ctx.trainer.evaluate(ctx.model, ctx.data.val)[0]}

    # b serves version 1 only: rounds 2 and 3 take it stale after the (short) fetch wait
    a, b = code_nodes(tmp_path, 2, [[1], [0]], settings=dataclasses.replace(SETTINGS, fetch_timeout_s=0.3),
                      strategy=Scheduled(), fresh_strategy=Scheduled)
    base = a.parts.trainer.config
    records = rounds_of(a, b, 1, 2, 3)
    assert seen == [(1, 0.1, 1), (2, 0.05, 1), (3, 0.025, 0)]
    assert records[2].train_steps == 0 and records[0].train_steps > 0
    assert [r.to_json()["fit_config"] for r in records] == [{"lr": 0.1, "epochs": 1}, {"lr": 0.05, "epochs": 1},
                                                           {"lr": 0.025, "epochs": 0}]
    assert all(0.0 <= r.to_json()["metrics"]["val_acc_by_hook"] <= 1.0 for r in records)
    assert a.parts.trainer.config == base
    with pytest.raises(ValueError, match=r"fit_config returned \['learning_rate'\]"):
        round_config(TrainConfig(), {"learning_rate": 0.1}, private=False)
    with pytest.raises(ValueError, match="under privacy"):
        round_config(TrainConfig(), {"epochs": 2}, private=True)
    with pytest.raises(ValueError, match="fit_config: .*train.epochs"):
        round_config(TrainConfig(), {"epochs": -1}, private=False)
