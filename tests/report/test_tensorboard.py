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
    # Exported again: the earlier event files are replaced, so every scalar appears once.
    assert main(["export", str(run), "--tensorboard"]) == 0
    assert len(list((logdir / "node-1").glob("events.out.tfevents.*"))) == 1
    assert scalars("node-1", "accuracy/after_training") == [(1, 0.61), (2, 0.71), (3, 0.81)]


def test_a_compare_folder_exports_one_run_per_row_and_seed(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "cmp"
    for row in ("local", "fedavg"):
        for seed in (0, 1):
            (out / row / f"seed{seed}").mkdir(parents=True)
            (out / row / f"seed{seed}" / "results.json").write_text(json.dumps(_results()))
    (out / "compare.json").write_text(json.dumps({"seeds": [0, 1], "rows": {"local": [], "fedavg": []}}))
    assert main(["export", str(out), "--tensorboard"]) == 0
    events = EventAccumulator(str(out / "tensorboard" / "fedavg" / "seed1" / "mean"))
    events.Reload()
    assert [e.step for e in events.Scalars("accuracy/after_training")] == [1, 2, 3]
    assert sorted(p.name for p in (out / "tensorboard").iterdir()) == ["fedavg", "local"]


@pytest.mark.slow
def test_a_run_writes_its_scalars_live(tmp_path: Path) -> None:
    """`p2pfl run --tensorboard`: a node's scalars can be read while the run still goes."""
    pytest.importorskip("tensorboard")
    import subprocess
    import sys
    import time

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.runtime.helpers import write_tiny

    scenario = write_tiny(tmp_path, nodes=2, rounds=200, samples=40, timeout=5.0)
    out, logdir = tmp_path / "run", tmp_path / "tb"
    run = subprocess.Popen([sys.executable, "-m", "p2pfl", "run", str(scenario), "--out", str(out), "--no-progress",
                            "--tensorboard", str(logdir)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen: list[int] = []
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and run.poll() is None and not seen:
            if (logdir / "node-0").is_dir():
                events = EventAccumulator(str(logdir / "node-0"))
                events.Reload()
                if "accuracy/after_training" in events.Tags()["scalars"]:
                    seen = [e.step for e in events.Scalars("accuracy/after_training")]
            time.sleep(0.2)
        assert seen and run.poll() is None, "no scalar was readable while the run went on"
        _, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, err[-2000:]
    assert seen[0] == 1 and seen == sorted(seen)
    results = json.loads((out / "results.json").read_text())
    events = EventAccumulator(str(logdir / "node-0"), size_guidance={"scalars": 0})
    events.Reload()
    steps = [e.step for e in events.Scalars("accuracy/after_training")]
    assert steps == [r["round"] for r in results["nodes"][0]["rounds"]]  # every round, once
    mean = EventAccumulator(str(logdir / "mean"), size_guidance={"scalars": 0})
    mean.Reload()
    assert len(mean.Scalars("accuracy/after_training")) == 200


def test_a_folder_without_results_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("tensorboard")
    assert main(["export", str(tmp_path), "--tensorboard"]) == 2
    assert "results.json" in capsys.readouterr().err


def test_the_hooks_metrics_and_settings_reach_tensorboard_and_the_report(tmp_path: Path) -> None:
    """Issue 67, item 7: `evaluate`'s metrics and `fit_config`'s learning rate were in results.json only."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from p2pfl.report.run_figures import plot_hooks

    results = _results()
    for node in results["nodes"]:
        for record in node["rounds"]:
            record["metrics"] = {"acc_weighted": 0.1 * record["round"], "note": "text is not a scalar"}
            record["fit_config"] = {"lr": 0.1 / record["round"], "epochs": 1}
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").write_text(json.dumps(results))
    assert main(["export", str(run), "--tensorboard"]) == 0
    events = EventAccumulator(str(run / "tensorboard" / "mean"))
    events.Reload()
    assert {"metrics/acc_weighted", "fit/lr", "fit/epochs"} <= set(events.Tags()["scalars"])
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("fit/lr")] == [(1, 0.1), (2, 0.05), (3, 0.033333)]
    assert plot_hooks(results, tmp_path) == tmp_path / "hooks.png" and (tmp_path / "hooks.png").is_file()
    assert plot_hooks(_results(), tmp_path / "none") is None  # no hooks, no figure


def test_the_mean_run_is_written_as_each_round_ends_at_every_node(tmp_path: Path) -> None:
    """Issue 67, item 7: the `mean` run appeared only when the run ended."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from p2pfl.report.tensorboard import ScalarWriter

    writer = ScalarWriter(tmp_path, nodes=2)
    for node in ("node-0", "node-1"):
        writer.add(node, {"round": 1, "test_acc": 0.5 if node == "node-0" else 0.7})
    writer.add("node-0", {"round": 2, "test_acc": 0.9})  # node-1 not there yet: no mean for round 2
    writer.flush()
    events = EventAccumulator(str(tmp_path / "mean"))
    events.Reload()
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("accuracy/after_training")] == [(1, 0.6)]
    writer.close("t")  # at the end, what is there (node-1 left early)
    events = EventAccumulator(str(tmp_path / "mean"))
    events.Reload()
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("accuracy/after_training")] == [(1, 0.6), (2, 0.9)]
