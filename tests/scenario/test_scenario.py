"""Scenario validation: a wrong field is named, and `p2pfl run` exits with status 2 before starting anything."""

from __future__ import annotations

import subprocess
import sys

import pytest

from p2pfl.errors import ConfigError
from p2pfl.scenario.schema import apply_overrides, load_scenario, parse_override, read_raw, scenario_from_dict

from ..runtime.helpers import write_tiny


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("nodes=0", "nodes"),
        ("rounds='three'", "rounds"),
        ("colour=1", "colour"),
        ("model.name='resnet'", "model.name"),
        ("algorithm.name='fedmagic'", "algorithm.name"),
        ("algorithm.params.gamma=1", "algorithm.params.gamma"),
        ("train.lr=-1", "train.lr"),
        ("train.optimizer='adagrad'", "train.optimizer"),
        ("train.batch_size=1.5", "train.batch_size"),
        ("runtime.fetch_timeout_s=0", "runtime.fetch_timeout_s"),
        ("runtime.linger=3", "runtime.linger"),
        ("runtime.placement='cluster'", "runtime.placement"),
        ("runtime.workers=-1", "runtime.workers"),
        ("runtime.topology='star'", "runtime.topology"),
        ("data.partition='random'", "data.partition"),
        ("data.dataset='imagenet'", "data.dataset"),
        ("privacy.mode='magic'", "privacy.mode"),
    ],
)
def test_wrong_field_is_named(tmp_path, override, field):
    raw = apply_overrides(read_raw(write_tiny(tmp_path)), [override])
    with pytest.raises(ConfigError) as info:
        scenario_from_dict(raw)
    assert info.value.field == field, str(info.value)


def test_overrides_are_typed(tmp_path):
    sc = load_scenario(write_tiny(tmp_path), ["rounds=5", "train.lr=0.01", "runtime.accept_stale=false"])
    assert (sc.rounds, sc.train.lr, sc.runtime.accept_stale) == (5, 0.01, False)
    assert parse_override("algorithm.params.variant=-lambda") == (["algorithm", "params", "variant"], "-lambda")


def test_resolved_scenario_round_trips(tmp_path):
    sc = load_scenario(write_tiny(tmp_path))
    assert scenario_from_dict(sc.to_dict()).to_dict() == sc.to_dict()


@pytest.mark.slow
def test_cli_exits_2_and_names_the_field(tmp_path):
    path = write_tiny(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "p2pfl", "run", str(path), "--out", str(tmp_path / "run"),
                           "--set", "train.epochs=-1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "train.epochs" in proc.stderr
    assert not (tmp_path / "run").exists(), "nothing starts before the scenario is valid"


@pytest.mark.slow
def test_an_existing_run_folder_is_never_reused_silently(tmp_path, capsys):
    import json

    from p2pfl.cli import main

    scenario = write_tiny(tmp_path, nodes=2, rounds=1, samples=40)
    out = tmp_path / "run"
    (out / "nodes").mkdir(parents=True)
    stale = {"id": "node-0", "status": "ok", "rounds": [], "final_test_acc": 0.999, "marker": "old run"}
    (out / "nodes" / "node-0.result.json").write_text(json.dumps(stale))
    assert main(["run", str(scenario), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "error in --out" in err and "already holds a run" in err and "--force" in err
    assert json.loads((out / "nodes" / "node-0.result.json").read_text()) == stale  # untouched

    assert main(["run", str(scenario), "--out", str(out), "--no-progress", "--force"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert "marker" not in json.dumps(results)
    assert [n["status"] for n in results["nodes"]] == ["ok", "ok"]


def test_compare_reuse_takes_a_run_of_the_same_scenario_and_refuses_another(tmp_path):
    import json

    from p2pfl.runtime.run_folder import compare_run
    from p2pfl.scenario.compare import parse_algorithms, row_raw, run_compare

    path = write_tiny(tmp_path, nodes=2, rounds=1, samples=40)
    rows = parse_algorithms("fedavg[train.lr=0.01]")
    raw = row_raw(read_raw(path), rows[0])
    raw["seed"] = 3

    def plant(scenario: dict) -> dict:
        run = compare_run(tmp_path / "cmp", rows[0].label, 3)
        run.mkdir(parents=True, exist_ok=True)
        results = {"scenario": scenario, "nodes": [{"id": "node-0", "rounds": [], "final_test_acc": 0.5}],
                   "summary": {"mean_acc": 0.5, "mean_acc_aggregated": 0.5, "total_bytes": 0, "wall_s": 1.0,
                               "nodes_failed": 0}}
        (run / "results.json").write_text(json.dumps(results))
        return results

    same = scenario_from_dict(raw).to_dict()
    plant(same)  # reused as it is: nothing runs, so this takes no time
    assert run_compare(path, rows, [3], tmp_path / "cmp", reuse=True, progress=False) == 0
    assert "| fedavg[train.lr=0.01] |" in (tmp_path / "cmp" / "compare.md").read_text()

    plant({**same, "runtime": {**same["runtime"], "workers": 12}})  # more processes hosting the same nodes
    assert run_compare(path, rows, [3], tmp_path / "cmp", reuse=True, progress=False) == 0

    stored = plant({**same, "rounds": 7, "train": {**same["train"], "lr": 0.1}})
    with pytest.raises(ConfigError) as info:  # seed 4 has no run; it is refused before seed 4 would start
        run_compare(path, rows, [4, 3], tmp_path / "cmp", reuse=True, progress=False)
    assert info.value.field == "--reuse" and "rounds, train.lr differ" in str(info.value)
    assert json.loads((compare_run(tmp_path / "cmp", rows[0].label, 3) / "results.json").read_text()) == stored
    assert not compare_run(tmp_path / "cmp", rows[0].label, 4).exists()


@pytest.mark.slow
def test_compare_reuse_runs_a_failed_run_again(tmp_path, capsys):
    """A run whose nodes failed (a machine that ran out of memory, a run cut short) is no result:
    --reuse runs it again instead of averaging its NaN into the table."""
    import json

    from p2pfl.runtime.run_folder import compare_run
    from p2pfl.scenario.compare import parse_algorithms, row_raw, run_compare
    from p2pfl.scenario.compare.table import _cell

    path = write_tiny(tmp_path, nodes=2, rounds=1, samples=40)
    rows = parse_algorithms("fedavg")
    raw = row_raw(read_raw(path), rows[0])
    raw["seed"] = 0
    run = compare_run(tmp_path / "cmp", rows[0].label, 0)
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({
        "scenario": scenario_from_dict(raw).to_dict(), "nodes": [],
        "summary": {"mean_acc": float("nan"), "mean_acc_aggregated": float("nan"), "total_bytes": 0, "wall_s": 1.0,
                    "nodes_failed": ["node-0", "node-1"]}}))
    assert run_compare(path, rows, [0], tmp_path / "cmp", reuse=True, progress=False) == 0
    assert "has failed nodes (node-0, node-1); running it again" in capsys.readouterr().err
    summary = json.loads((run / "results.json").read_text())["summary"]
    assert summary["nodes_failed"] == [] and summary["mean_acc"] == summary["mean_acc"]
    assert _cell([0.5, float("nan"), 0.7]) == "60.0 (10.0)"  # a failed seed in a table made by hand


@pytest.mark.slow
def test_compare_reuse_gathers_a_folders_rows_over_several_calls(tmp_path, capsys):
    """A row added later with --reuse joins the table after the folder's earlier rows; an earlier
    row whose runs no longer match the scenario, or lack a seed, is left out, saying why."""
    import json

    from p2pfl.runtime.run_folder import compare_run
    from p2pfl.scenario.compare import parse_algorithms, row_raw, run_compare

    path = write_tiny(tmp_path, nodes=2, rounds=1, samples=40)
    out = tmp_path / "cmp"

    def plant(label: str, seed: int, acc: float, **changes) -> None:
        raw = row_raw(read_raw(path), parse_algorithms(label)[0])
        raw["seed"] = seed
        run = compare_run(out, label, seed)
        run.mkdir(parents=True, exist_ok=True)
        (run / "results.json").write_text(json.dumps({
            "scenario": {**scenario_from_dict(raw).to_dict(), **changes},
            "nodes": [{"id": "node-0", "rounds": [], "final_test_acc": acc}],
            "summary": {"mean_acc": acc, "mean_acc_aggregated": acc, "total_bytes": 0, "wall_s": 1.0,
                        "nodes_failed": 0}}))

    def listed() -> list[str]:
        return list(json.loads((out / "compare.json").read_text())["rows"])

    for seed in (3, 4):
        plant("local", seed, 0.5)
        plant("fedavg[train.lr=0.01]", seed, 0.6)
        plant("fedavg", seed, 0.7)
    assert run_compare(path, parse_algorithms("local,fedavg"), [3, 4], out, reuse=True, progress=False) == 0
    assert listed() == ["local", "fedavg"]
    assert run_compare(path, parse_algorithms("fedavg[train.lr=0.01]"), [3, 4], out, reuse=True, progress=False) == 0
    assert listed() == ["local", "fedavg", "fedavg[train.lr=0.01]"]
    table = (out / "compare.md").read_text()
    assert "| local | 50.0 (0.0)" in table and "| fedavg | 70.0 (0.0)" in table
    assert run_compare(path, parse_algorithms("local,fedavg[train.lr=0.01]"), [3, 4], out, reuse=True,
                       progress=False) == 0
    assert listed() == ["local", "fedavg", "fedavg[train.lr=0.01]"], "an earlier row goes back after its predecessor"
    assert run_compare(path, parse_algorithms("fedavg,local"), [3, 4], out, reuse=True, progress=False) == 0
    assert listed() == ["fedavg", "fedavg[train.lr=0.01]", "local"], "the rows asked for follow this call's order"

    plant("fedavg", 4, 0.7, rounds=9)
    capsys.readouterr()
    assert run_compare(path, parse_algorithms("local"), [3, 4], out, reuse=True, progress=False) == 0
    assert listed() == ["fedavg[train.lr=0.01]", "local"]
    assert "leaves out the earlier row 'fedavg'" in capsys.readouterr().err
    assert run_compare(path, parse_algorithms("local"), [3], out, force=True, progress=False) == 0
    assert listed() == ["local"], "with --force the table is this call's rows"
    assert run_compare(path, parse_algorithms("fedavg"), [3], out, reuse=True, progress=False) == 0
    assert listed() == ["local", "fedavg"]


def test_compare_reuse_keeps_rows_made_with_other_overrides(tmp_path, capsys):
    """Client2Vec's ablation runs its index-reading rows with `--set algorithm.params.indices_from=...`
    into the folder where the rows that build no index ran without it: each earlier row is checked
    against the overrides it was made with, not this call's, so the one table holds them all."""
    import json

    from p2pfl.runtime.run_folder import compare_run
    from p2pfl.scenario.compare import parse_algorithms, row_raw, run_compare

    path = write_tiny(tmp_path, nodes=2, rounds=1, samples=40)
    out = tmp_path / "cmp"

    def plant(label: str, seed: int, overrides: list[str]) -> None:
        raw = row_raw(apply_overrides(read_raw(path), overrides), parse_algorithms(label)[0])
        raw["seed"] = seed
        run = compare_run(out, label, seed)
        run.mkdir(parents=True, exist_ok=True)
        (run / "results.json").write_text(json.dumps({
            "scenario": scenario_from_dict(raw).to_dict(),
            "nodes": [{"id": "node-0", "rounds": [], "final_test_acc": 0.5}],
            "summary": {"mean_acc": 0.5, "mean_acc_aggregated": 0.5, "total_bytes": 0, "wall_s": 1.0,
                        "nodes_failed": 0}}))

    for seed in (3, 4):
        plant("local", seed, [])
        plant("fedavg", seed, ["rounds=9"])
    assert run_compare(path, parse_algorithms("local"), [3, 4], out, reuse=True, progress=False) == 0
    assert run_compare(path, parse_algorithms("fedavg"), [3, 4], out, ["rounds=9"], reuse=True, progress=False,
                       reference="local") == 0
    listing = json.loads((out / "compare.json").read_text())
    assert list(listing["rows"]) == ["local", "fedavg"]
    assert listing["row_overrides"] == {"local": [], "fedavg": ["rounds=9"]}
    assert "Δ vs local" in (out / "compare.md").read_text()
    capsys.readouterr()
    assert run_compare(path, parse_algorithms("local"), [3, 4], out, reuse=True, progress=False) == 0
    assert list(json.loads((out / "compare.json").read_text())["rows"]) == ["local", "fedavg"]
    assert "leaves out" not in capsys.readouterr().err
    # A listing from before rows kept their own overrides: its rows matched the overrides of the call that wrote it.
    listing = json.loads((out / "compare.json").read_text())
    del listing["row_overrides"]
    listing["overrides"] = ["rounds=9"]
    listing["rows"] = {"fedavg": listing["rows"]["fedavg"]}
    (out / "compare.json").write_text(json.dumps(listing))
    assert run_compare(path, parse_algorithms("local"), [3, 4], out, reuse=True, progress=False) == 0
    assert json.loads((out / "compare.json").read_text())["row_overrides"] == {"local": [], "fedavg": ["rounds=9"]}


def test_compare_reuse_refuses_a_run_made_on_other_synth_data(tmp_path, monkeypatch):
    """synth is rendered from the machine's fonts: a run made when other fonts were installed
    measured other data, and is refused with the way to pin the fonts."""
    import json

    from p2pfl.data.digits import FONT_DIRS_ENV, cache_name
    from p2pfl.runtime.run_folder import compare_run
    from p2pfl.scenario.compare import parse_algorithms, row_raw, run_compare

    path = write_tiny(tmp_path, nodes=2, rounds=1, samples=40)
    text = path.read_text().replace('dataset = "mnist"\npartition = "iid"',
                                    'dataset = "digits"\npartition = "domain"\ndomains = ["mnist", "synth"]')
    path.write_text(text)
    rows = parse_algorithms("local")
    raw = row_raw(read_raw(path), rows[0])
    raw["seed"] = 0
    run = compare_run(tmp_path / "cmp", rows[0].label, 0)
    run.mkdir(parents=True)
    fonts = tmp_path / "fonts"
    fonts.mkdir()
    monkeypatch.setenv(FONT_DIRS_ENV, str(fonts))
    made_on = {"synth": cache_name("synth")}
    (run / "results.json").write_text(json.dumps({
        "scenario": scenario_from_dict(raw).to_dict(), "data_fingerprint": made_on,
        "nodes": [{"id": "node-0", "rounds": [], "final_test_acc": 0.5}],
        "summary": {"mean_acc": 0.5, "mean_acc_aggregated": 0.5, "total_bytes": 0, "wall_s": 1.0, "nodes_failed": 0}}))
    assert run_compare(path, rows, [0], tmp_path / "cmp", reuse=True, progress=False) == 0  # same fonts: taken
    (fonts / "Extra.ttf").write_bytes(b"a font installed since")
    assert cache_name("synth") != made_on["synth"]
    with pytest.raises(ConfigError, match="other data.*P2PFL_FONT_DIRS") as info:
        run_compare(path, rows, [0], tmp_path / "cmp", reuse=True, progress=False)
    assert info.value.field == "--reuse"


def test_resume_refuses_a_run_folder_of_another_scenario_naming_the_fields(tmp_path):
    import json

    from p2pfl.runtime.run_folder import RunFolder
    from p2pfl.scenario.launcher import existing_run_folder

    scenario = load_scenario(write_tiny(tmp_path, nodes=2, rounds=1, samples=40))
    stored = RunFolder(tmp_path / "run").scenario
    stored.parent.mkdir(parents=True)
    stored.write_text(json.dumps({**scenario.to_dict(), "rounds": 9}))
    with pytest.raises(ConfigError) as info:
        existing_run_folder(scenario, tmp_path / "run")
    assert info.value.field == "--resume" and str(info.value).endswith("(rounds)")
    assert json.loads(stored.read_text())["rounds"] == 9


def test_a_sweep_row_stands_for_the_value_validation_chooses_never_the_test_split(tmp_path):
    """Per seed, the value with the best mean validation accuracy is the row; a value that is
    better on test but worse on validation is not chosen. Runs planted with --reuse, so nothing runs."""
    import json

    from p2pfl.runtime.run_folder import compare_row_runs
    from p2pfl.runtime.run_folder import compare_run
    from p2pfl.scenario.compare import parse_algorithms, row_raw, run_compare

    path = write_tiny(tmp_path, nodes=2, rounds=1, samples=40)
    (row,) = parse_algorithms("fedavg[train.lr=0.01|0.1]")
    assert row.sweep_key == "train.lr" and [c.label for c in row.candidates] == ["fedavg[train.lr=0.01]",
                                                                                 "fedavg[train.lr=0.1]"]
    # seed -> candidate -> (validation, test) accuracy of both nodes' last round
    planted = {0: {"fedavg[train.lr=0.01]": (0.80, 0.95), "fedavg[train.lr=0.1]": (0.90, 0.70)},
               1: {"fedavg[train.lr=0.01]": (0.85, 0.60), "fedavg[train.lr=0.1]": (0.75, 0.99)}}
    for seed, by_label in planted.items():
        for candidate in row.candidates:
            val, test = by_label[candidate.label]
            raw = row_raw(read_raw(path), candidate)
            raw["seed"] = seed
            nodes = [{"id": f"node-{i}", "final_test_acc": test, "final_test_acc_aggregated": test,
                      "rounds": [{"round": 1, "test_acc": test, "test_acc_aggregated": test, "val_acc": val}]}
                     for i in range(2)]
            run = compare_run(tmp_path / "cmp", candidate.label, seed)
            run.mkdir(parents=True)
            (run / "results.json").write_text(json.dumps({
                "scenario": scenario_from_dict(raw).to_dict(), "nodes": nodes,
                "summary": {"mean_acc": test, "mean_acc_aggregated": test, "total_bytes": 0, "wall_s": 1.0,
                            "nodes_failed": 0}}))
    assert run_compare(path, [row], [0, 1], tmp_path / "cmp", reuse=True, progress=False) == 0
    doc = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert doc["chosen"] == {row.label: {"0": "fedavg[train.lr=0.1]", "1": "fedavg[train.lr=0.01]"}}
    assert [r["final"] for r in doc["rows"][row.label]] == [0.70, 0.60]  # the test accuracy of the chosen values
    table = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| fedavg[train.lr=0.01\\|0.1] |" in table and "seed 0 → `fedavg[train.lr=0.1]`" in table
    assert compare_row_runs(tmp_path / "cmp")[row.label] == [  # what Comparison.load and the report read
        compare_run(tmp_path / "cmp", "fedavg[train.lr=0.1]", 0), compare_run(tmp_path / "cmp", "fedavg[train.lr=0.01]", 1)]
    with pytest.raises(ConfigError, match="one hyperparameter"):
        parse_algorithms("fedavg[train.lr=0.01|0.1,train.epochs=1|2]")
    with pytest.raises(ConfigError, match="distinct"):
        parse_algorithms("fedavg[train.lr=0.1|0.1]")


def test_compare_reference_must_name_a_row(tmp_path):
    from p2pfl.scenario.compare import parse_algorithms, run_compare

    path = write_tiny(tmp_path, nodes=2, rounds=1, samples=40)
    with pytest.raises(ConfigError, match="not one of the rows") as info:
        run_compare(path, parse_algorithms("fedavg,local"), [0], tmp_path / "cmp", progress=False, reference="fedprox")
    assert info.value.field == "--reference" and not (tmp_path / "cmp").exists()


@pytest.mark.slow
def test_compare_refuses_a_folder_holding_runs_without_reuse_or_force(tmp_path, capsys):
    """Review finding 11: Before, a second `p2pfl compare` into the same folder re-ran every row and replaced the
    earlier runs, exit 0: now it is refused as `p2pfl run` refuses, and nothing is touched."""
    import json

    from p2pfl.cli import main

    path = write_tiny(tmp_path, nodes=2, rounds=1, samples=40)
    out = tmp_path / "cmp"
    assert main(["compare", str(path), "--algorithms", "local", "--seeds", "0", "--out", str(out),
                 "--no-progress"]) == 0
    results = next(out.glob("*/*/results.json"))
    before = results.read_bytes()
    capsys.readouterr()
    assert main(["compare", str(path), "--algorithms", "local", "--seeds", "0", "--out", str(out),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "holds runs of an earlier comparison" in err and "--reuse" in err and "--force" in err
    assert results.read_bytes() == before
    assert main(["compare", str(path), "--algorithms", "local", "--seeds", "0", "--out", str(out), "--reuse",
                 "--force", "--no-progress"]) == 2
    assert "pass one of them" in capsys.readouterr().err
    assert main(["compare", str(path), "--algorithms", "local", "--seeds", "0", "--out", str(results),
                 "--no-progress"]) == 2
    assert "is a file" in capsys.readouterr().err
    assert main(["compare", str(path), "--algorithms", "local", "--seeds", "0", "--out", str(out), "--force",
                 "--no-progress"]) == 0
    assert json.loads(results.read_text())["summary"]["nodes_failed"] == []


def test_a_mistyped_field_gets_the_close_match(tmp_path):
    with pytest.raises(ConfigError, match="unknown field; did you mean 'rounds'\\?") as info:
        scenario_from_dict({"roundz": 3})
    assert info.value.field == "roundz"
    with pytest.raises(ConfigError, match="did you mean 'fetch_timeout_s'") as info:
        scenario_from_dict({"runtime": {"fetch_timout_s": 3}})
    assert info.value.field == "runtime.fetch_timout_s"
    with pytest.raises(ConfigError) as info:
        scenario_from_dict({"zzz": 1})
    assert "did you mean" not in str(info.value)


@pytest.mark.parametrize("stored_ratio", [4.0, 0.0, None])
def test_compare_reuse_refuses_a_run_made_with_another_max_weight_ratio(tmp_path, stored_ratio):
    """runtime.max_weight_ratio changes what FedAvg computes where sizes differ: a stored run made
    with another value, or one that predates its being recorded (it cannot say), is not taken."""
    import json

    from p2pfl.runtime.run_folder import compare_run
    from p2pfl.scenario.compare import parse_algorithms, row_raw, run_compare

    path = write_tiny(tmp_path, nodes=2, rounds=1, samples=40)
    path.write_text(path.read_text() + "\n[runtime]\nmax_weight_ratio = 0\n" if "[runtime]" not in path.read_text()
                    else path.read_text().replace("[runtime]", "[runtime]\nmax_weight_ratio = 0", 1))
    rows = parse_algorithms("local")
    raw = row_raw(read_raw(path), rows[0])
    raw["seed"] = 0
    stored = scenario_from_dict(raw).to_dict()
    assert stored["runtime"]["max_weight_ratio"] == 0  # always recorded, at its default too
    if stored_ratio is None:
        del stored["runtime"]["max_weight_ratio"]
    else:
        stored["runtime"]["max_weight_ratio"] = stored_ratio
    run = compare_run(tmp_path / "cmp", rows[0].label, 0)
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({
        "scenario": stored, "nodes": [{"id": "node-0", "rounds": [], "final_test_acc": 0.5}],
        "summary": {"mean_acc": 0.5, "mean_acc_aggregated": 0.5, "total_bytes": 0, "wall_s": 1.0, "nodes_failed": 0}}))
    if stored_ratio == 0.0:
        assert run_compare(path, rows, [0], tmp_path / "cmp", reuse=True, progress=False) == 0
        return
    with pytest.raises(ConfigError, match="runtime.max_weight_ratio") as info:
        run_compare(path, rows, [0], tmp_path / "cmp", reuse=True, progress=False)
    assert info.value.field == "--reuse"
    if stored_ratio is None:
        assert "not recorded" in str(info.value)
