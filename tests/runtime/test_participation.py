"""Issue 31, point 4: partial participation never waits for a neighbour that sits the round out,
and a node that sits out does no per-round work beyond serving."""

from __future__ import annotations

from pathlib import Path

from p2pfl.assembly import node_seed
from p2pfl.runtime.node.records import after_training, final_accuracies
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
        last_trained = [r for r in result["rounds"] if r["participated"]][-1]
        assert result["final_test_acc"] == last_trained["test_acc"], result["id"]
        assert result["final_test_acc_aggregated"] == result["rounds"][-1]["test_acc_aggregated"], result["id"]


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


def _record(r: int, took_part: bool, after_training: float, aggregated: float) -> dict:
    return {"round": r, "participated": took_part, "test_acc": after_training, "test_acc_aggregated": aggregated,
            "val_acc": after_training, "val_acc_aggregated": aggregated}


def test_a_nodes_accuracy_after_training_is_that_of_the_last_round_it_trained_in() -> None:
    """FedAvg+FT under 10 % participation: a node trains in round 94 (0.76 after its local epochs,
    0.05 for the aggregate it then holds) and sits rounds 95-100 out, holding that aggregate. Its
    accuracy after training is 0.76, not the aggregate's 0.05 a sat-out round measures."""
    rounds = [_record(94, True, 0.76, 0.05)] + [_record(r, False, 0.05, 0.05) for r in range(95, 101)]
    assert final_accuracies(rounds) == (0.76, 0.05)
    assert final_accuracies([_record(1, True, 0.5, 0.6), _record(2, True, 0.7, 0.8)]) == (0.7, 0.8)
    assert final_accuracies([_record(1, False, 0.1, 0.1)]) == (0.1, 0.1)  # never trained: the model as built
    assert final_accuracies([]) == (None, None)
    schedule = [_record(1, False, 0.1, 0.1), _record(2, True, 0.6, 0.7), _record(3, False, 0.7, 0.7),
                _record(4, True, 0.8, 0.9), _record(5, False, 0.9, 0.9)]
    assert after_training(schedule) == [0.1, 0.6, 0.6, 0.8, 0.8]  # the model as built, then the latest training


def test_compare_tabulates_a_stored_run_from_its_rounds() -> None:
    """A run stored before this definition kept the last round's number as its accuracy after
    training; `compare --reuse` tabulates it as a run made today would be."""
    from p2pfl.scenario.compare import summarize_run

    sat_out_last = [_record(1, True, 0.76, 0.05), _record(2, False, 0.05, 0.05)]
    trained_last = [_record(1, False, 0.3, 0.3), _record(2, True, 0.9, 0.8)]
    results = {"scenario": {"seed": 0}, "nodes": [
        {"id": "node-0", "rounds": sat_out_last, "final_test_acc": 0.05, "final_test_acc_aggregated": 0.05},
        {"id": "node-1", "rounds": trained_last, "final_test_acc": 0.9, "final_test_acc_aggregated": 0.8},
        {"id": "node-2", "rounds": [], "final_test_acc": None, "status": "failed"}],
        "summary": {"mean_acc": 0.475, "total_bytes": 0, "wall_s": 1.0}}
    summary = summarize_run(results)
    assert summary["node_acc"] == [0.76, 0.9, None]
    assert summary["final"] == (0.76 + 0.9) / 2
    assert summary["val"] == (0.76 + 0.9) / 2  # what a sweep chooses on: after training, too
    assert summary["best"] == (0.76 + 0.9) / 2  # round 2, node-0 still at its round-1 training
