"""Tables that the docs' numbers are copied from: built from small hand-made compare folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from p2pfl.cli import main
from p2pfl.report.tables import communication_table, held_out_table, mean_std, record_table, relevance_table


def _results(seed: int, held_out: str | None, acc: float, k: list[int], received: list[int]) -> dict:
    rounds = [
        {"round": i + 1, "test_acc": acc, "test_acc_aggregated": acc, "param_bytes_received": b,
         "strategy": {"k": kk, "lambda_self": 0.2 + 0.1 * seed}}
        for i, (kk, b) in enumerate(zip(k, received))
    ]
    return {
        "scenario": {"seed": seed, "data": {"held_out_domain": held_out}},
        "nodes": [{"id": "node-0", "rounds": rounds, "final_test_acc": acc}],
        "summary": {"mean_acc": acc, "mean_acc_aggregated": acc, "total_bytes": sum(received),
                    "wall_s": 1.0, "held_out_acc": acc, "held_out_acc_best": acc + 0.1},
        "relevance_scores": {"per_round": [
            {"round": 1, "precision": 0.5 + 0.1 * seed, "recall": 1.0, "precision_at_k": 0.5, "spearman": 0.0}
        ]},
    }


def _compare_folder(root: Path, name: str, held_out: str | None, accs: dict[str, list[float]]) -> Path:
    folder = root / name
    for label, per_seed in accs.items():
        for seed, acc in enumerate(per_seed):
            run = folder / label / f"seed{seed}"
            run.mkdir(parents=True)
            (run / "results.json").write_text(json.dumps(
                _results(seed, held_out, acc, k=[3, 2], received=[2**20, 3 * 2**20])))
    (folder / "compare.json").write_text(json.dumps({"rows": {label: [] for label in accs}}))
    return folder


def test_mean_std_skips_missing_values() -> None:
    assert mean_std([0.5, None, float("nan"), 0.7], scale=100, digits=1) == "60.0 (10.0)"
    assert mean_std([None]) == "-"


def test_relevance_and_communication_tables_average_over_seeds(tmp_path: Path) -> None:
    from p2pfl.report.tables import _row_runs

    folder = _compare_folder(tmp_path, "cmp", None, {"pfedsv": [0.9, 0.8]})
    runs = _row_runs(folder)
    relevance = relevance_table(runs)
    assert relevance is not None
    # precision 0.5 and 0.6 over the two seeds
    assert "| pfedsv | 1 | 0.55 (0.05) | 1.00 (0.00) | 0.50 (0.00) | 0.00 (0.00) |" in relevance
    assert "| pfedsv | 0.25 (0.05) | 0.25 (0.05) |" in record_table(runs, "lambda_self")
    assert record_table(runs, "no_such_record") is None
    comm = communication_table(runs)
    assert "| pfedsv | 4.0 (0.0) | 1.0 (0.0) | 3.0 (0.0) | 3.0 2.0 |" in comm
    # A row whose strategy records no k (a top-k sparse FedAvg): the peers whose parts arrived.
    for run in runs["pfedsv"]:
        for record in run["nodes"][0]["rounds"]:
            record["strategy"] = {}
            record["asked"], record["arrived"] = 4, ["node-1", "node-2", "node-3"][:record["round"] + 1]
    assert "| 2.0 3.0 |" in communication_table(runs)  # issue 67, item 8: was "-"


def test_held_out_table_has_one_column_per_domain_and_a_per_seed_average(tmp_path: Path) -> None:
    a = _compare_folder(tmp_path, "di_a", "mnist", {"di": [0.5, 0.7], "ga": [0.4, 0.4]})
    b = _compare_folder(tmp_path, "di_b", "usps", {"di": [0.7, 0.9], "ga": [0.6, 0.6]})
    table = held_out_table([a, b])
    assert table.splitlines()[0] == "| row | mnist | usps | avg (final round) | avg (best round) |"
    # di: per-seed averages 0.6 and 0.8 -> 70.0 (10.0); best is +0.1 everywhere
    assert "| di | 60.0 (10.0) | 80.0 (10.0) | 70.0 (10.0) | 80.0 (10.0) |" in table
    assert "| ga | 40.0 (0.0) | 60.0 (0.0) | 50.0 (0.0) | 60.0 (0.0) |" in table


def test_report_command_writes_the_cross_folder_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from p2pfl.report import report_held_out

    a = _compare_folder(tmp_path, "di_a", "mnist", {"di": [0.5]})
    b = _compare_folder(tmp_path, "di_b", "usps", {"di": [0.7]})
    path = report_held_out([a, b], tmp_path / "tables")
    assert path.read_text().startswith("| row | mnist | usps |")
    assert main(["report", str(tmp_path / "nothing-here")]) == 2
    assert "nothing-here" in capsys.readouterr().err


@pytest.mark.slow
def test_report_merges_a_lan_runs_per_node_results(tmp_path: Path) -> None:
    """No launcher on a LAN: nodes' own result files plus scenario.json make the report."""
    from p2pfl.report import make_report
    from p2pfl.scenario.launcher import run_scenario
    from tests.runtime.helpers import write_tiny

    out = tmp_path / "run"
    launched, code = run_scenario(write_tiny(tmp_path, nodes=2, rounds=1, samples=40), out, progress=False, quiet=True)
    assert code == 0
    (out / "results.json").unlink()  # what a folder of copied LAN node results looks like
    paths = make_report(out)
    merged = json.loads((out / "results.json").read_text())
    assert [n["id"] for n in merged["nodes"]] == ["node-0", "node-1"]
    assert [n["final_test_acc"] for n in merged["nodes"]] == [n["final_test_acc"] for n in launched["nodes"]]
    assert merged["summary"]["mean_acc"] == launched["summary"]["mean_acc"]
    assert {"accuracy.png", "loss.png", "bytes_per_round.png"} <= {p.name for p in paths}


def test_record_table_reads_node_records_and_counts_a_set_flag_as_one() -> None:
    def run(seed: int, kept: list[list[bool]]) -> dict:
        nodes = [{"id": f"node-{i}", "rounds": [{"round": r + 1, "safeguard_kept_own": k, "strategy": {"gamma": 2.0 + seed}}
                                                 for r, k in enumerate(flags)]} for i, flags in enumerate(kept)]
        return {"nodes": nodes}

    runs = {"fedc2i": [run(0, [[True, False], [False, False]]), run(1, [[True, True], [False, True]])]}
    # round 1: 1/2 nodes in both seeds; round 2: 0/2 and 2/2
    assert "| fedc2i | 0.50 (0.00) | 0.50 (0.50) |" in record_table(runs, "safeguard_kept_own")
    assert "| fedc2i | 2.50 (0.50) | 2.50 (0.50) |" in record_table(runs, "gamma")


def _summary(seed: int, accs: list[float], aggregated: list[float] | None = None) -> dict:
    return {"seed": seed, "node_labels": [f"node-{i}" for i in range(len(accs))], "node_acc": accs,
            "node_acc_aggregated": accs if aggregated is None else aggregated,
            "final": sum(accs) / len(accs), "best": None, "final_aggregated": None, "best_aggregated": None,
            "total_bytes": 0, "held_out_acc": None, "epsilon": None, "wall_s": 1.0}


def test_worst_vs_local_is_the_per_seed_minimum_of_node_gaps_against_the_same_seeds_local_run() -> None:
    from p2pfl.scenario.compare.table import format_table, worst_vs_baseline

    local = [_summary(0, [0.8, 0.6]), _summary(1, [0.7, 0.7])]
    fedavg = [_summary(1, [0.75, 0.72], [0.5, 0.9]), _summary(0, [0.9, 0.5], [0.85, 0.62]),
              _summary(2, [0.0, 0.0])]  # seed 2: no local run
    gaps = worst_vs_baseline(fedavg, local)
    assert gaps == pytest.approx([0.02, -0.1])
    # after aggregation each node's aggregate is set against the same Local run (trained alone)
    assert worst_vs_baseline(fedavg, local, "node_acc_aggregated") == pytest.approx([-0.2, 0.02])
    table = format_table({"local": local, "fedavg": fedavg})
    header, _, local_row, fedavg_row = table.splitlines()[:4]
    column = header.split(" | ").index("worst vs local")
    assert local_row.split(" | ")[column] == "-"
    assert fedavg_row.split(" | ")[column] == "-4.0 (6.0)"
    aggregated_column = header.split(" | ").index("worst aggregated vs local")
    assert fedavg_row.split(" | ")[aggregated_column] == "-9.0 (11.0)"
    assert "worst vs local" not in format_table({"fedavg": fedavg})


def test_worst_vs_local_measures_against_the_one_local_row_when_none_is_labelled_local() -> None:
    from p2pfl.scenario.compare import format_table

    local = [_summary(0, [0.8, 0.6])]
    fedavg = [_summary(0, [0.9, 0.5])]
    table = format_table({"fedavg": fedavg, 'local[privacy={mode="none"}]': local})
    header, _, fedavg_row, local_row = table.splitlines()[:4]
    column = header.split(" | ").index("worst vs local")
    assert fedavg_row.split(" | ")[column] == "-10.0 (0.0)"
    assert local_row.split(" | ")[column] == "-"
    # two Local rows and neither labelled `local`: no row to measure against
    assert "worst vs" not in format_table({"fedavg": fedavg, "local[a=1]": local, "local[a=2]": local})


def test_setup_bytes_are_counted_where_they_arrive_and_get_a_column_only_when_present() -> None:
    from p2pfl.scenario.compare.table import format_table, setup_bytes

    results = {"nodes": [{"setup": {"bytes_received": 3 * 2**20, "bytes_sent": 5}}, {"setup": None}, {}],
               "coordinator": {"setup": {"bytes_received": 2**20, "bytes_sent": 0}}}
    assert setup_bytes(results) == 4 * 2**20
    assert setup_bytes({"nodes": [{}]}) == 0
    plain = [_summary(0, [0.5, 0.5])]
    indexed = [{**_summary(0, [0.5, 0.5]), "setup_bytes": 4 * 2**20}]
    assert "before round 1" not in format_table({"fedavg": plain})
    greeted = [{**_summary(0, [0.5, 0.5]), "setup_bytes": 860}]  # round-0 control messages, not an index
    assert "before round 1" not in format_table({"fedavg": plain, "fedc2i": greeted})
    table = format_table({"fedavg": plain, "client2vec": indexed})
    header, _, fedavg_row, indexed_row = table.splitlines()[:4]
    column = header.split(" | ").index("of which before round 1")
    assert fedavg_row.split(" | ")[column] == "0.0" and indexed_row.split(" | ")[column] == "4.0"


def test_unanswered_downloads_are_counted_per_peer_over_the_runs_second_half_and_flag_the_run() -> None:
    from p2pfl.scenario.compare.table import format_table, starved_runs
    from p2pfl.scenario.results import download_health, download_warning

    def rounds(*asked_unanswered: tuple[int, int]) -> list[dict]:
        return [{"round": i + 1, "asked": a, "unanswered": u} for i, (a, u) in enumerate(asked_unanswered)]

    # Four rounds: the first half's misses (peers still in their first round) do not count.
    healthy = [{"rounds": rounds((4, 4), (4, 2), (4, 0), (4, 0))}, {"rounds": rounds((4, 3), (4, 0), (4, 0), (4, 1))}]
    health = download_health(healthy)
    assert (health["asked"], health["unanswered"]) == (32, 10)
    assert (health["asked_second_half"], health["unanswered_second_half"]) == (16, 1)
    assert download_warning(health) is None  # 1 in 16 is under the 10 % that warns
    starved = [{"rounds": rounds((4, 2), (4, 2), (4, 2), (4, 1))}]
    warning = download_warning(download_health(starved))
    assert warning is not None and "38 % of the downloads" in warning and "(3 of 8)" in warning
    # Records made before `unanswered` was kept: peers asked for less the distinct senders that arrived
    # (a peer whose two parts arrived answered once).
    old = [{"rounds": [{"round": 1, "asked": 3, "arrived": ["a", "a", "b"]}, {"round": 2, "asked": 3, "arrived": ["a"]}]}]
    assert download_health(old)["unanswered"] == 3 and download_health(old)["unanswered_share_second_half"] == 2 / 3
    # A run that asks nobody (Local) has no share and no warning.
    assert download_health([{"rounds": rounds((0, 0), (0, 0))}])["unanswered_share_second_half"] is None
    assert download_warning(download_health([])) is None
    # compare.md names the run that starved, and only that one.
    fine, hungry = _summary(0, [0.5, 0.5]), {**_summary(1, [0.5, 0.5]), "unanswered_share": 0.5}
    assert starved_runs({"fedavg": [fine, hungry]}) == ["fedavg seed 1 (50 %)"]
    assert "Not comparable" in format_table({"fedavg": [fine, hungry]})
    assert "Not comparable" not in format_table({"fedavg": [fine]})


def _guarded_round(local: float, federated: float, federated_aggregated: float, evidence: tuple[int, int],
                   evidence_trained: tuple[int, int]) -> dict:
    return {"round": 1, "test_acc_local": local, "test_acc_federated": federated,
            "test_acc_federated_aggregated": federated_aggregated, "safeguard_evidence": list(evidence),
            "safeguard_evidence_trained": list(evidence_trained)}


def test_deployed_at_level_decides_again_from_the_recorded_evidence() -> None:
    from p2pfl.report.tables import deployed_at_level

    r = _guarded_round(0.8, 0.9, 0.7, evidence=(3, 1), evidence_trained=(2, 0))
    # after aggregation 3 - 1 = 2 against z * sqrt(4): certified at z = 0 (level 0.5), not at 1.645 (0.05)
    assert deployed_at_level(r, 0.5, aggregated=True) == (0.7, True)
    assert deployed_at_level(r, 0.05, aggregated=True) == (0.8, False)
    assert deployed_at_level(r, 0.2, aggregated=True) == (0.7, True)   # z = 0.84: 2 > 1.68
    assert deployed_at_level(r, 0.1, aggregated=True) == (0.8, False)  # z = 1.28: 2 <= 2.56
    # after training 2 - 0 = 2 against z * sqrt(2): 2 > 1.28 * 1.41, 2 <= 1.645 * 1.41
    assert deployed_at_level(r, 0.1, aggregated=False) == (0.9, True)
    assert deployed_at_level(r, 0.05, aggregated=False) == (0.8, False)
    with pytest.raises(ValueError, match="level"):
        deployed_at_level(r, 1.0, aggregated=True)


def test_safeguard_levels_are_the_mean_and_worst_gap_of_the_nodes_redecided_per_seed() -> None:
    from p2pfl.report.tables import safeguard_level_table, safeguard_levels

    def run(rounds: list[dict]) -> dict:
        return {"nodes": [{"id": f"node-{i}", "rounds": [{**r, "round": 2}]} for i, r in enumerate(rounds)]}

    seed0 = run([_guarded_round(0.8, 0.9, 0.95, (10, 0), (10, 0)),    # certified at every level
                 _guarded_round(0.7, 0.6, 0.5, (2, 1), (2, 1))])      # only at level 0.5 (z = 0)
    seed1 = run([_guarded_round(0.6, 0.9, 0.9, (0, 0), (0, 0)),       # no evidence: Local at every level
                 _guarded_round(0.9, 0.8, 0.8, (5, 0), (1, 0))])
    runs = {"local": [{"nodes": [{"id": "node-0", "rounds": [{"round": 2, "test_acc": 0.8}]}]}],
            "pfedsv[g]": [seed0, seed1]}
    out = safeguard_levels(runs, levels=(0.05, 0.5))
    assert list(out) == ["pfedsv[g]"]  # rows without the evidence are left out
    strict, lax = out["pfedsv[g]"][0.05, True], out["pfedsv[g]"][0.5, True]
    # brute force: per seed, the deployed accuracies, their mean, and the worst gap to Local
    assert strict.mean == pytest.approx([(0.95 + 0.7) / 2, (0.6 + 0.8) / 2])
    assert strict.worst == pytest.approx([0.0, -0.1]) and strict.federated == [1, 1] and strict.nodes == 4
    assert lax.mean == pytest.approx([(0.95 + 0.5) / 2, (0.6 + 0.8) / 2])
    assert lax.worst == pytest.approx([-0.2, -0.1]) and lax.federated == [2, 1]
    trained_strict = out["pfedsv[g]"][0.05, False]
    assert trained_strict.mean == pytest.approx([(0.9 + 0.7) / 2, (0.6 + 0.9) / 2]) and trained_strict.federated == [1, 0]
    table = safeguard_level_table(out)
    assert "| pfedsv[g] | 0.05 | 77.5 (2.5) | 76.2 (6.2) | 0.0 (0.0) | -5.0 (5.0) | 1 / 4, 2 / 4 |" in table
    assert safeguard_level_table(safeguard_levels({"local": runs["local"]})) is None


def _poison_compare(folder: Path, accs: dict[str, list[list[float]]], attack: str) -> Path:
    """A compare folder by hand: per row, per seed, each node's final accuracy (node 0 attacks)."""
    import json as _json

    from p2pfl.runtime.run_folder import RunFolder, compare_run

    seeds = range(len(next(iter(accs.values()))))
    for label, per_seed in accs.items():
        for seed, nodes in zip(seeds, per_seed):
            run = RunFolder(compare_run(folder, label, seed))
            run.root.mkdir(parents=True)
            run.results.write_text(_json.dumps({
                "scenario": {"seed": seed, "attack": {"kind": attack, "nodes": [0], "scale": 1.0}},
                "nodes": [{"id": f"node-{i}", "final_test_acc": a, "rounds": []} for i, a in enumerate(nodes)]}))
    (folder / "compare.json").write_text(_json.dumps({"seeds": list(seeds), "rows": {label: [] for label in accs}}))
    return folder


def test_the_poisoning_grid_pairs_each_attacked_run_with_its_clean_seed(tmp_path: Path) -> None:
    from p2pfl.report.tables import poisoning_grid_table

    # Node 0 attacks: its accuracy (0.0) never counts. Honest mean per seed is the mean of nodes 1-2.
    clean0 = _poison_compare(tmp_path / "clean_b0", {"fedavg": [[0.0, 0.9, 0.7], [0.0, 0.8, 0.8], [0.0, 0.6, 0.8]]},
                             "none")
    clean1 = _poison_compare(tmp_path / "clean_b1", {"fedavg": [[0.0, 0.8, 0.8], [0.0, 0.8, 0.8], [0.0, 0.7, 0.7]]},
                             "none")
    hit0 = _poison_compare(tmp_path / "noise_b0", {"fedavg": [[0.0, 0.1, 0.1]] * 3}, "noise")
    hit1 = _poison_compare(tmp_path / "noise_b1", {"fedavg": [[0.0, 0.8, 0.6], [0.0, 0.7, 0.7], [0.0, 0.7, 0.5]]},
                           "noise")
    table = poisoning_grid_table({0.0: clean0, 1.0: clean1}, {"noise": {0.0: hit0, 1.0: hit1}})
    row = next(line for line in table.splitlines() if line.startswith("| noise | fedavg"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "76.7 (4.7)" and cells[4] == "10.0 (0.0)" and cells[5] == "66.7 (4.7)"
    # Paired by seed: (0.7 - 0.8), (0.7 - 0.8), (0.6 - 0.7) = -0.1 each: an interval of width 0.
    assert cells[6].startswith("-10.0") and cells[8] == "3"
    # Against the clean run under the bound: (0.7 - 0.8), (0.7 - 0.8), (0.6 - 0.7), -0.1 again.
    assert cells[7].startswith("-10.0")


def test_the_per_node_note_says_what_one_test_sample_is_worth() -> None:
    from p2pfl.scenario.compare.table import per_node_test_note

    assert "one test sample is 1 point of" in per_node_test_note({"a": [{"test_sizes": [100, 100]}]})
    assert "hold 23–181 samples: one test sample is 0.55–4.3 points of" in per_node_test_note(
        {"a": [{"test_sizes": [181, 23]}], "b": [{"test_sizes": [0]}]})
    assert per_node_test_note({"a": [{"seed": 0}]}) is None


def test_held_out_table_tests_each_rows_average_against_the_reference_with_holm(tmp_path: Path) -> None:
    from scipy import stats

    ref = [0.50, 0.60, 0.55, 0.40, 0.45]
    di = [0.52, 0.63, 0.56, 0.44, 0.46]  # above the reference in every seed
    ga = [0.49, 0.62, 0.50, 0.43, 0.44]  # mixed
    folders = []
    for name, shift in (("mnist", 0.0), ("usps", 0.1)):
        accs = {"fedavg_global": [a + shift for a in ref], "di": [a + shift for a in di], "ga": [a + shift for a in ga]}
        folder = _compare_folder(tmp_path, name, name, accs)
        (folder / "compare.json").write_text(json.dumps({"rows": {k: [] for k in accs}, "reference": "fedavg_global"}))
        folders.append(folder)
    table = held_out_table(folders)
    assert table.splitlines()[0].endswith("| avg − fedavg_global, paired over seeds (Holm over the rows) |")
    p_di, p_ga = stats.ttest_rel(di, ref).pvalue, stats.ttest_rel(ga, ref).pvalue
    assert p_di < p_ga
    holm_di, holm_ga = min(1.0, 2 * p_di), max(min(1.0, 2 * p_di), p_ga)  # Holm over two tests, by hand
    row = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()[2:]}
    assert f"p={p_di:.2g} (Holm {holm_di:.2g})" in row["di"] and "+2.2 [" in row["di"], row["di"]
    assert f"p={p_ga:.2g} (Holm {holm_ga:.2g}) level" in row["ga"], row["ga"]
    assert row["fedavg_global"].endswith("| – |")
    # no reference named: no paired column
    assert "paired" not in held_out_table([_compare_folder(tmp_path, "x", "uci", {"di": [0.5, 0.6]})])


def test_the_poisoning_table_pairs_each_attacked_seed_with_its_clean_run_and_corrects_over_rows(tmp_path: Path) -> None:
    from scipy import stats

    from p2pfl.report.tables import poisoning_table

    clean = {"pfedsv": [0.90, 0.80, 0.85, 0.95, 0.90], "fedavg": [0.90, 0.80, 0.85, 0.95, 0.90]}
    hit = {"pfedsv": [0.89, 0.81, 0.84, 0.95, 0.90], "fedavg": [0.80, 0.71, 0.74, 0.86, 0.79]}
    folders = []
    for name, accs, attack in (("clean", clean, "none"), ("noise", hit, "noise")):
        folder = _poison_compare(tmp_path / name, {k: [[0.0, a, a] for a in v] for k, v in accs.items()}, attack)
        for label in accs:  # what poisoning_table reads of the scenario besides the attack
            for run in (folder / label).iterdir():
                results = json.loads((run / "results.json").read_text())
                results["scenario"].update(nodes=3, algorithm={"name": label, "params": {"k": 1}})
                (run / "results.json").write_text(json.dumps(results))
        folders.append(folder)
    rows = {line.split(" | ")[0].lstrip("| "): [c.strip() for c in line.strip("|").split("|")]
            for line in poisoning_table(folders).splitlines()[2:]}
    p_fedavg = stats.ttest_rel(hit["fedavg"], clean["fedavg"]).pvalue
    p_pfedsv = stats.ttest_rel(hit["pfedsv"], clean["pfedsv"]).pvalue
    assert p_fedavg < 0.01 < p_pfedsv
    # Holm over the two rows, by hand: the smaller p doubled, the larger kept (not below it).
    assert rows["fedavg"][4].startswith("-10.0 [") and f"(Holm {2 * p_fedavg:.2g}) lower" in rows["fedavg"][4]
    assert f"(Holm {max(p_pfedsv, 2 * p_fedavg):.2g}) level" in rows["pfedsv"][4]
    assert rows["pfedsv"][6] == "2"  # the bound: ceil((3 - 1 - 1) / 1) + 1
