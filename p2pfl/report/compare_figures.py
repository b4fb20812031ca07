"""Figures and tables of a compare folder, and of several (held-out domains, poisoning)."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from p2pfl.report.style import protocol_panels, round_axis, save_figure, series_style
from p2pfl.report.tables import LevelOutcome, held_out_table, poisoning_table, safeguard_levels, write_compare_tables
from p2pfl.runtime.run_folder import RunFolder, compare_row_runs
from p2pfl.runtime.node.records import TEST_ACC, TEST_ACC_AGGREGATED, accuracies


def report_compare(folder: Path) -> list[Path]:
    data = json.loads((folder / "compare.json").read_text())
    rows = data["rows"]
    out = folder / "report"
    out.mkdir(exist_ok=True)
    labels = list(rows)
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(labels)), 4))
    for offset, key, name in ((-0.2, "final", "after local training"), (0.2, "final_aggregated", "after aggregation")):
        means = [np.mean([r[key] for r in rows[l]]) for l in labels]
        stds = [np.std([r[key] for r in rows[l]]) for l in labels]
        ax.bar(np.arange(len(labels)) + offset, means, 0.4, yerr=stds, capsize=3, label=name)
    ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("mean test accuracy over nodes")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    paths = [save_figure(fig, out / "accuracy.png")]
    runs_by_row = {label: [json.loads(RunFolder(run).results.read_text()) for run in runs
                           if RunFolder(run).results.is_file()]
                   for label, runs in compare_row_runs(folder).items()}
    # Communication per algorithm per round (pFedSV Fig. 8), from the per-run results.
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, runs in runs_by_row.items():
        per_round: dict[int, list[float]] = defaultdict(list)
        for res in runs:
            by_round: dict[int, float] = defaultdict(float)
            for n in res["nodes"]:
                for r in n["rounds"]:
                    by_round[r["round"]] += r["param_bytes_received"]
            for r, v in by_round.items():
                per_round[r].append(v / 2**20)
        if per_round:
            xs = sorted(per_round)
            ax.plot(xs, [np.mean(per_round[x]) for x in xs], marker="o", label=label)
    round_axis(ax)
    ax.set_ylabel("parameter MiB downloaded (all nodes)")
    ax.set_title("communication per round")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    paths.append(save_figure(fig, out / "communication.png"))
    paths.append(_compare_curves(runs_by_row, out))
    against = _accuracy_against_bytes(rows, out)
    if against is not None:
        paths.append(against)
    levels = plot_safeguard_levels(safeguard_levels(runs_by_row), rows, out)
    if levels is not None:
        paths.append(levels)
    return paths + write_compare_tables(folder, out)


def bytes_points(rows: Mapping[str, list[dict[str, Any]]]) -> dict[str, tuple[list[float], list[float], list[float]]]:
    """Per row that moved bytes: per seed, MiB sent per node, final accuracy, and after aggregation."""
    points = {}
    for label, runs in rows.items():
        mib = [r["total_bytes"] / max(1, r.get("nodes") or 1) / 2**20 for r in runs]
        if runs and float(np.mean(mib)) > 0:
            points[label] = (mib, [r["final"] for r in runs], [r["final_aggregated"] for r in runs])
    return points


def _accuracy_against_bytes(rows: Mapping[str, list[dict[str, Any]]], out: Path) -> Path | None:
    """Each row's final accuracy against the MiB a node sent over the run (every frame: what the
    others received, on average),
    means over seeds with their spread: the figure communication papers print. None when no row
    moved a byte (Local)."""
    points = bytes_points(rows)
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    for i, (label, (mib, trained, aggregated)) in enumerate(points.items()):
        colour = f"C{i % 10}"
        x = float(np.mean(mib))
        trained_pct, aggregated_pct = 100 * np.asarray(trained, float), 100 * np.asarray(aggregated, float)
        ax.errorbar(x, trained_pct.mean(), xerr=np.std(mib), yerr=trained_pct.std(), fmt="o", color=colour,
                    capsize=3, label=label)
        ax.errorbar(x, aggregated_pct.mean(), yerr=aggregated_pct.std(), fmt="o", mfc="none", color=colour, capsize=3)
    ax.set_xscale("log")
    ax.set_xlabel("MiB sent per node over the run (all frames)")
    ax.set_ylabel("final mean test accuracy (%)")  # in percent, as the tables print it
    ax.set_title("accuracy against bytes (filled: after training; hollow: after aggregation)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the points, never over them
    return save_figure(fig, out / "accuracy_vs_bytes.png")


def plot_safeguard_levels(outcomes: Mapping[str, Mapping[tuple[float, bool], LevelOutcome]],
                          rows: Mapping[str, list[Mapping[str, Any]]], out: Path) -> Path | None:
    """The "local" safeguard's trade-off over its test level, judged again from the recorded
    evidence: mean accuracy (left; dotted: the unguarded rows of the folder) and the worst node's
    gap to its Local model (right; the issue's -0.5 line), after training and after aggregation."""
    if not outcomes:
        return None
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for i, (label, by_level) in enumerate(outcomes.items()):
        levels = sorted({lv for lv, _ in by_level})
        for aggregated, style, marker in ((False, "--", "s"), (True, "-", "o")):
            name = f"{label} ({'after aggregation' if aggregated else 'after training'})"
            colour = f"C{i}"
            left.plot(levels, [100 * np.mean(by_level[lv, aggregated].mean) for lv in levels], style, marker=marker,
                      color=colour, label=name)
            right.plot(levels, [100 * np.mean(by_level[lv, aggregated].worst) for lv in levels], style, marker=marker,
                       color=colour, label=name)
    for j, (label, runs) in enumerate((lab, r) for lab, r in rows.items() if lab not in outcomes):
        left.axhline(100 * np.mean([r["final"] for r in runs]), color=f"C{len(outcomes) + j}", linestyle=":",
                     label=f"{label} (after training)")
    right.axhline(-0.5, color="grey", linestyle=":", label="-0.5 points")
    for ax, ylabel in ((left, "mean test accuracy over nodes (%)"), (right, "worst node minus its Local (points)")):
        ax.set_xscale("log")
        ax.set_xlabel("safeguard_level (one-sided level of the sign test)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    left.legend(fontsize=6)
    right.legend(fontsize=6)
    fig.suptitle("the local safeguard at other levels, decided again from the recorded validation evidence")
    return save_figure(fig, out / "safeguard_levels.png")


def _compare_curves(runs_by_row: Mapping[str, list[dict[str, Any]]], out: Path) -> Path:
    """Mean accuracy over nodes per round, one line per algorithm (band: min-max over seeds),
    after local training and after aggregation."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for i, (label, runs) in enumerate(runs_by_row.items()):
        for ax, key in zip(axes, (TEST_ACC, TEST_ACC_AGGREGATED)):
            per_round: dict[int, list[float]] = defaultdict(list)
            for res in runs:
                by_round: dict[int, list[float]] = defaultdict(list)
                for n in res["nodes"]:
                    for r, value in zip(n["rounds"], accuracies(n["rounds"], key)):
                        if value is not None:
                            by_round[r["round"]].append(value)
                for r, v in by_round.items():
                    per_round[r].append(float(np.mean(v)))
            if not per_round:
                continue
            xs = sorted(per_round)
            line, = ax.plot(xs, [np.mean(per_round[x]) for x in xs], label=label, **series_style(i))
            if len(runs) > 1:
                ax.fill_between(xs, [min(per_round[x]) for x in xs], [max(per_round[x]) for x in xs],
                                color=line.get_color(), alpha=0.15)
    protocol_panels(axes, "mean test accuracy over nodes", prefix="")
    return save_figure(fig, out / "accuracy_by_round.png")


def report_held_out(folders: list[Path], out: Path) -> Path:
    """`held_out.md` across compare folders that differ in `data.held_out_domain`."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "held_out.md"
    path.write_text(held_out_table([Path(f) for f in folders]) + "\n")
    return path


def report_poisoning(folders: list[Path], out: Path) -> Path:
    """`poisoning.md` from an attacked and an attack-free compare folder of one scenario."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "poisoning.md"
    path.write_text(poisoning_table([Path(f) for f in folders]) + "\n")
    return path


