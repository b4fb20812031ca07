"""`p2pfl export --tensorboard RUN` (issue 33, item 6): scalars per node and their mean, read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from p2pfl.cli import main


def _results() -> dict:
    def node(i: int) -> dict:
        return {"id": f"node-{i}", "rounds": [
            {"round": r, "test_acc": 0.5 + 0.1 * r + 0.01 * i, "test_acc_aggregated": 0.4 + 0.1 * r,
             "train_loss": 1.0 / r, "test_loss": None, "epsilon": "inf", "bytes_received": 1000 * r}
            for r in (1, 2, 3)]}

    return {"scenario": {"name": "tiny", "rounds": 3}, "algorithm": "fedavg", "nodes": [node(0), node(1)]}


def test_a_run_exports_each_nodes_scalars_and_their_mean(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(_results()))
    assert main(["export", str(run), "--tensorboard"]) == 0
    logdir = run / "tensorboard"
    assert sorted(p.name for p in logdir.iterdir()) == ["mean", "node-0", "node-1"]

    def scalars(name: str, tag: str) -> list[tuple[int, float]]:
        events = EventAccumulator(str(logdir / name))
        events.Reload()
        return [(e.step, round(e.value, 6)) for e in events.Scalars(tag)]

    assert scalars("node-1", "accuracy/after_training") == [(1, 0.61), (2, 0.71), (3, 0.81)]
    assert scalars("mean", "accuracy/after_training") == [(1, 0.605), (2, 0.705), (3, 0.805)]
    assert scalars("mean", "bytes/received") == [(1, 1000.0), (2, 2000.0), (3, 3000.0)]
    tags = EventAccumulator(str(logdir / "node-0"))
    tags.Reload()
    assert "loss/test" not in tags.Tags()["scalars"] and "privacy/epsilon" not in tags.Tags()["scalars"]  # none, inf


def test_a_folder_without_results_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("tensorboard")
    assert main(["export", str(tmp_path), "--tensorboard"]) == 2
    assert "results.json" in capsys.readouterr().err
