"""`data.extra_test_splits` (issue 62's calibration, ours): a run scores every node on more test-split
readings at no extra training. What makes it a fair shortcut is checked on real rounds: the training
and the run's own scores are those of a run without the extras, and each extra reading's scores are
those of a run made with that `data.test_split`, to the last digit."""

from __future__ import annotations

from pathlib import Path

from .helpers import build_in_process, run_in_process, write_tiny


def _rounds(tmp_path: Path, name: str, *overrides: str) -> list[list[dict]]:
    scenario = write_tiny(tmp_path, nodes=3, rounds=2, samples=80)
    nodes, coordinator = build_in_process(scenario, tmp_path / name,
                                          ('data.partition="dirichlet"', "data.alpha=0.3", "data.min_size=5", *overrides))
    results, _, _ = run_in_process(nodes, coordinator)
    assert [r["status"] for r in results] == ["ok"] * 3, [r.get("error") for r in results]
    return [r["rounds"] for r in results]


def test_extra_readings_score_what_a_run_with_that_test_split_scores_and_change_nothing_else(tmp_path: Path) -> None:
    plain = _rounds(tmp_path, "plain")
    extras = _rounds(tmp_path, "extras", 'data.extra_test_splits=["global", "own_classes_balanced"]')
    as_global = _rounds(tmp_path, "global", 'data.test_split="global"')
    for without, with_extras, scored_globally in zip(plain, extras, as_global):
        for a, b, g in zip(without, with_extras, scored_globally):
            for key in ("test_acc", "test_acc_aggregated", "val_acc", "val_acc_aggregated", "train_loss"):
                assert a[key] == b[key], (key, a[key], b[key])  # the extras change no training and no own score
            for key in ("val_acc", "val_acc_aggregated", "train_loss"):
                assert a[key] == g[key], (key, a[key], g[key])  # nor does the test_split
            assert b["test_acc_by_split"]["global"] == g["test_acc"]
            assert b["test_acc_aggregated_by_split"]["global"] == g["test_acc_aggregated"]
            assert set(b["test_acc_by_split"]) == {"global", "own_classes_balanced"}
            assert "test_acc_by_split" not in a  # absent where no extra reading is asked for
