"""Issue 31, point 4: partial participation never waits for a neighbour that sits the round out,
and a node that sits out does no per-round work beyond serving."""

from __future__ import annotations

from pathlib import Path

from p2pfl.assembly import node_seed
from p2pfl.runtime.participation import rounds_taking_part, version_to_ask

from .helpers import build_in_process, run_in_process, write_tiny


def test_the_version_asked_of_a_neighbour_follows_its_schedule() -> None:
    rounds_in = frozenset({2, 5})
    assert version_to_ask(None, 3, True) == 3  # unknown schedule: as before
    assert version_to_ask(rounds_in, 5, True) == 5
    assert version_to_ask(rounds_in, 4, True) == 2  # sits 4 out: its round-2 version, at once
    assert version_to_ask(rounds_in, 1, True) is None  # has published nothing yet
    assert version_to_ask(rounds_in, 4, False) is None  # stale versions not taken


def test_sitting_out_neighbours_are_asked_for_their_last_version_and_never_waited_for(tmp_path: Path) -> None:
    scenario = write_tiny(tmp_path, nodes=4, rounds=5, samples=40, timeout=120.0)
    nodes, coordinator = build_in_process(scenario, tmp_path / "run", ("runtime.participation=0.5",))
    evaluations = {n.config.id: 0 for n in nodes}
    for n in nodes:
        evaluate = n.parts.trainer.evaluate

        def counted(model, split, batch_size=1024, _evaluate=evaluate, _id=n.config.id):
            evaluations[_id] += 1
            return _evaluate(model, split, batch_size)

        n.parts.trainer.evaluate = counted  # type: ignore[method-assign]
    results, _, _ = run_in_process(nodes, coordinator)
    schedule = {f"node-{i}": rounds_taking_part(node_seed(0, i), 5, 0.5) for i in range(4)}
    for result in results:
        took = {r["round"] for r in result["rounds"] if r["participated"]}
        assert took == schedule[result["id"]], result["id"]  # the draws a neighbour computes are the node's own
        for record in (r for r in result["rounds"] if r["participated"]):
            r = record["round"]
            for peer, rounds_in in schedule.items():
                if peer == result["id"] or r in rounds_in:
                    continue
                if any(x < r for x in rounds_in):  # sits out: its last version, taken, stale
                    assert peer in record["arrived"] and peer in record["stale"], (result["id"], r, peer)
                else:  # nothing published yet: not asked
                    assert peer in record.get("sat_out", []), (result["id"], r, peer)
            assert record["unanswered"] == 0
    # A round sat out is not scored again: the model has not changed since it was last scored.
    for result in results:
        took = [r for r in result["rounds"] if r["participated"]]
        first_scored_sitting = 1 if result["rounds"][0]["participated"] is False else 0
        # warm-up scores once; each round taken part in scores test and val twice at most
        assert evaluations[result["id"]] <= 1 + 4 * len(took) + 2 * first_scored_sitting, result["id"]
        for before, after in zip(result["rounds"], result["rounds"][1:]):
            if not after["participated"]:
                assert after["test_acc"] == before["test_acc_aggregated"]
        assert [r["round"] for r in result["rounds"]] == [1, 2, 3, 4, 5]  # every round recorded, taken part in or sat out


def test_a_node_that_sits_rounds_out_scores_its_model_once_before_the_first_round(tmp_path: Path, monkeypatch) -> None:
    """Sitting a round out is no work beyond serving: a node's model as built is scored once,
    before round 1, and every round it sits out before it first trains reports those scores."""
    from p2pfl.runtime.node.scoring import Scorer, Scores

    calls: list[tuple[str, int]] = []
    original = Scorer.model_scores
    path = write_tiny(tmp_path, nodes=6, rounds=3, samples=60)
    nodes, _ = build_in_process(path, tmp_path / "run", ("runtime.participation=0.3",))
    node_of = {id(n.scorer): n for n in nodes}

    def counted(self: Scorer) -> Scores:
        node = node_of[id(self)]
        calls.append((node.config.id, node.round))
        return original(self)

    monkeypatch.setattr(Scorer, "model_scores", counted)
    built = {n.config.id: {k: v.clone() for k, v in n.model.state_dict().items()} for n in nodes}
    results, _, _ = run_in_process(nodes, None)
    assert all(r["status"] in ("ok", "isolated") for r in results)
    late = [n for n in nodes if not n.rounds[0]["participated"]]
    assert late  # the seeded draws leave nodes out of round 1 at this size
    for node in nodes:
        assert [r for i, r in calls if i == node.config.id].count(0) == 1  # once before round 1
    for node in late:
        waited = node.rounds[:next((i for i, x in enumerate(node.rounds) if x["participated"]), len(node.rounds))]
        assert not any(i == node.config.id and r in {x["round"] for x in waited} for i, r in calls)  # not in them
        node.model.load_state_dict(built[node.config.id])
        test_acc, test_loss = node.parts.trainer.evaluate(node.model, node.parts.data.test)
        assert all(x["test_acc"] == test_acc and x["test_loss"] == test_loss for x in waited)
