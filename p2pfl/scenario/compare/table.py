"""A comparison's statistics and its paper-style table: a run's summary, mean (std) cells, the
paired differences against a reference row (Holm within the table), sweeps chosen on validation.

Cells are mean (std) over seeds of the unweighted mean over nodes (the papers do not weight by
sample count; `weighted_acc` in results.json does). Both evaluation points are shown: after local
training (`test_acc`, the deployed model) and right after aggregation (`test_acc_aggregated`;
FedAvg's global model).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from p2pfl.core.paired import LEVEL, MIN_SEEDS, PairedDifference, holm_corrected, paired_difference
from p2pfl.errors import ConfigError
from p2pfl.runtime.node.records import TEST_ACC_AGGREGATED, after_training, final_accuracies, last_trained
from p2pfl.scenario.compare.rows import Row, baseline_label, label_algorithm
from p2pfl.scenario.results import UNANSWERED_WARN_SHARE, active_defences, download_health

MAX_NODE_COLUMNS = 12


SETUP_COLUMN_MIN_BYTES = 0.05 * 2**20  # shows as 0.1 MiB


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    values = [v for v in values if v is not None and v == v]  # a failed run's NaN is no measurement
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values), statistics.pstdev(values) if len(values) > 1 else 0.0


def _cell(values: Sequence[float], scale: float = 100.0) -> str:
    if any(v == "inf" for v in values):
        return "∞"
    m, s = _mean_std(values)
    return "-" if m != m else f"{m * scale:.1f} ({s * scale:.1f})"


def _signed_cell(values: Sequence[float]) -> str:
    m, s = _mean_std(values)
    return "-" if m != m else f"{m * 100:+.1f} ({s * 100:.1f})"


def summarize_run(results: Mapping[str, Any]) -> dict[str, Any]:
    nodes = results["nodes"]
    seed = results.get("scenario", {}).get("seed")
    per_round: dict[int, list[float]] = {}
    per_round_agg: dict[int, list[float]] = {}
    for n in nodes:
        for r, acc in zip(n.get("rounds", []), after_training(n.get("rounds", []))):
            per_round.setdefault(r["round"], []).append(acc)
            per_round_agg.setdefault(r["round"], []).append(r[TEST_ACC_AGGREGATED])
    mean_by_round = {r: statistics.fmean(v) for r, v in per_round.items()}
    agg_by_round = {r: statistics.fmean(v) for r, v in per_round_agg.items()}
    last = [n["rounds"][-1] for n in nodes if n.get("rounds")]
    val = [last_trained(n["rounds"]).get("val_acc") for n in nodes if n.get("rounds")]
    # From the rounds, so that runs stored before a node's final accuracy after training came from
    # the last round it trained in (under partial participation) are tabulated as today's.
    node_acc = [final_accuracies(n["rounds"])[0] if n.get("rounds") and n.get("final_test_acc") is not None
                else n.get("final_test_acc") for n in nodes]
    finished = [a for a in node_acc if a is not None and a == a]
    gaining = [r for r in last if "safeguard_kept_own" in r]
    labels = [n.get("domain") or n["id"] for n in nodes]
    if len(set(labels)) != len(labels):  # several nodes per domain: "3 usps"
        labels = [n["id"].replace("node-", "") + (f" {n['domain']}" if n.get("domain") else "") for n in nodes]
    return {
        "seed": seed,
        "node_labels": labels,
        "node_acc": node_acc,
        "node_acc_aggregated": [n.get("final_test_acc_aggregated") for n in nodes],
        "final": statistics.fmean(finished) if finished else results["summary"]["mean_acc"],
        "best": max(mean_by_round.values()) if mean_by_round else None,
        "final_aggregated": results["summary"].get("mean_acc_aggregated"),
        "best_aggregated": max(agg_by_round.values()) if agg_by_round else None,
        "total_bytes": results["summary"]["total_bytes"],
        "total_param_bytes": results["summary"].get("total_param_bytes"),
        "setup_bytes": setup_bytes(results),
        "held_out_acc": results["summary"].get("held_out_acc"),
        "epsilon": results["summary"].get("max_epsilon"),
        "wall_s": results["summary"]["wall_s"],
        "defences": active_defences(results.get("scenario") or {}),
        "fell_back": (results["summary"].get("fell_back") or {}).get("node_rounds", 0),
        # From the nodes' rounds, so that runs made before the summary kept it are checked too.
        "unanswered_share": download_health(nodes)["unanswered_share_second_half"],
        # Mean over nodes of the federated model's validation accuracy after the last round's
        # training: what a sweep chooses on. None for runs made before nodes recorded it.
        "val": statistics.fmean(val) if val and None not in val else None,
        "test_sizes": [n.get("n_test") for n in (results.get("ground_truth") or {}).get("nodes", [])],
        # With the "local" safeguard: how many nodes deploy the federated model at the end because
        # their validation split certifies it better than their Local model.
        "certified": (sum(not r["safeguard_kept_own_trained"] for r in gaining) if gaining else None),
        "certified_aggregated": (sum(not r["safeguard_kept_own"] for r in gaining) if gaining else None),
        "nodes": len(nodes),
        "code_version": results.get("code_version"),
    }


def setup_bytes(results: Mapping[str, Any]) -> int:
    """Bytes on the wire before round 1 (Client2Vec's index, the peers' start-up announcements),
    counted where they arrive: every node's setup record and the coordinator's (which records what
    it received, not the replies it serves)."""
    records = [n.get("setup") or {} for n in results["nodes"]] + [(results.get("coordinator") or {}).get("setup") or {}]
    return sum(int(r.get("bytes_received", 0)) for r in records)


def worst_vs_baseline(runs: Sequence[Mapping[str, Any]], baseline: Sequence[Mapping[str, Any]],
                      protocol: str = "node_acc") -> list[float]:
    """Per seed, the minimum over nodes of (node accuracy - the same node's accuracy in the
    baseline run of the same seed): how much the worst-off node lost by joining. `protocol` picks
    the node's model: "node_acc" after training, "node_acc_aggregated" right after aggregation
    (the model the safeguard chooses); the baseline node is always scored after training, the model
    it would deploy alone. Seeds without a baseline run are left out."""
    by_seed = {b.get("seed"): b for b in baseline}
    worst = []
    for run in runs:
        base = by_seed.get(run.get("seed"))
        if base is None or run.get("seed") is None:
            continue
        mine = run.get(protocol) or []
        diffs = [a - b for a, b in zip(mine, base["node_acc"], strict=False) if a is not None and b is not None]
        if diffs:
            worst.append(min(diffs))
    return worst


def md_cell(text: str) -> str:
    """A table cell's text with the pipes of a sweep (`gamma=1|5`) escaped for Markdown."""
    return text.replace("|", "\\|")


PAIRED_KEYS = ("final", "final_aggregated")


def paired_table(rows: Mapping[str, Sequence[Mapping[str, Any]]], reference: str) -> dict[tuple[str, str], PairedDifference]:
    """(row, key) -> the paired difference of `key` (a run summary's accuracy) against the reference
    row, Holm-corrected over every such test of the table (both columns, every row)."""
    base = rows[reference]
    tests = {f"{label}\0{key}": paired_difference({r["seed"]: r.get(key) for r in runs}, {r["seed"]: r.get(key) for r in base})
             for label, runs in rows.items() if label != reference for key in PAIRED_KEYS}
    return {tuple(name.split("\0")): d for name, d in holm_corrected(tests).items()}  # type: ignore[misc]


def per_node_test_note(rows: Mapping[str, list[dict[str, Any]]]) -> str | None:
    """What one test sample is worth in the per-node columns."""
    sizes = [n for runs in rows.values() for r in runs for n in (r.get("test_sizes") or []) if n]
    if not sizes:
        return None
    lo, hi = min(sizes), max(sizes)
    span = f"{lo}" if lo == hi else f"{lo}–{hi}"
    worth = f"{100 / hi:.2g}" if lo == hi else f"{100 / hi:.2g}–{100 / lo:.2g}"
    unit = "point" if worth == "1" else "points"
    return (f"Per-node test splits hold {span} samples: one test sample is {worth} {unit} of a node's accuracy "
            f"(the per-node and *worst* columns move in those steps).")


def chosen_values(rows: Mapping[str, list[dict[str, Any]]]) -> dict[str, dict[int, str]]:
    """Sweep row -> seed -> the candidate row validation chose (from the summaries)."""
    return {label: {r["seed"]: r["chosen"] for r in runs} for label, runs in rows.items()
            if any(r.get("chosen") for r in runs)}


def format_table(rows: Mapping[str, list[dict[str, Any]]], baseline: str | None = None,
                 reference: str | None = None) -> str:
    first = next(iter(rows.values()))[0]
    baseline = baseline or baseline_label(list(rows))
    node_labels = first["node_labels"]
    show_held = any(s.get("held_out_acc") is not None for runs in rows.values() for s in runs)
    show_eps = any(s.get("epsilon") is not None for runs in rows.values() for s in runs)
    if len(node_labels) > MAX_NODE_COLUMNS:  # 100 columns help nobody; results.json has them all
        node_labels = []
    head = ["algorithm", *node_labels, "avg %", "best round %", "avg aggregated %", "best round aggregated %"]
    if show_held:
        head.append("held-out")
    if show_eps:
        head.append("epsilon")
    show_worst = baseline in rows and len(rows) > 1
    baseline_name = label_algorithm(baseline or "")
    if show_worst:
        head += [f"worst vs {baseline_name}", f"worst aggregated vs {baseline_name}"]
    show_certified = any(r.get("certified") is not None for runs in rows.values() for r in runs)
    if show_certified:
        head += ["nodes certified gaining", "nodes certified gaining aggregated"]
    show_paired = reference is not None and reference in rows and len(rows) > 1
    paired = paired_table(rows, reference) if show_paired else {}  # type: ignore[arg-type]
    if show_paired:
        head += [f"Δ vs {reference}", f"Δ aggregated vs {reference}"]
    # Every run has control messages before round 1 (a few hundred bytes per node); a column that
    # would read 0.0 MiB in every row says nothing, so it appears for an index-sized exchange only.
    show_setup = any(statistics.fmean(r.get("setup_bytes") or 0 for r in runs) >= SETUP_COLUMN_MIN_BYTES
                     for runs in rows.values())
    head += ["MiB sent", *(["of which before round 1"] if show_setup else []), "seeds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, runs in rows.items():
        cells = [md_cell(label)]
        for i in range(len(node_labels)):
            cells.append(_cell([r["node_acc"][i] for r in runs if i < len(r["node_acc"])]))
        cells += [_cell([r["final"] for r in runs]), _cell([r["best"] for r in runs]),
                  _cell([r["final_aggregated"] for r in runs]), _cell([r["best_aggregated"] for r in runs])]
        if show_held:
            cells.append(_cell([r["held_out_acc"] for r in runs]))
        if show_eps:
            cells.append(_cell([r["epsilon"] for r in runs], scale=1.0))
        if show_worst:
            for protocol in ("node_acc", "node_acc_aggregated"):
                cells.append("-" if label == baseline else _signed_cell(worst_vs_baseline(runs, rows[baseline], protocol)))
        if show_certified:
            for key in ("certified", "certified_aggregated"):
                counts = [r[key] for r in runs if r.get(key) is not None]
                cells.append(f"{statistics.fmean(counts):.1f} of {runs[0].get('nodes')}" if counts else "-")
        if show_paired:
            for key in PAIRED_KEYS:
                cells.append("-" if label == reference else paired[(label, key)].cell())
        cells.append(f"{statistics.fmean(r['total_bytes'] for r in runs) / 2**20:.1f}")
        if show_setup:
            cells.append(f"{statistics.fmean(r.get('setup_bytes') or 0 for r in runs) / 2**20:.1f}")
        cells.append(str(len(runs)))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Test accuracy in percent, mean (std) over seeds, of the mean over nodes after the last round each "
                 "node trained in (the last round, unless it sat that out); *best round*: the round with the highest "
                 "mean, picked on the test split (optimistic); *aggregated*: the model a node ends with, right after "
                 "its last aggregation."
                 + (f" *worst vs {baseline_name}*: per seed, the minimum over nodes of the node's accuracy minus the same "
                    f"node's `{baseline}` accuracy (same seed), in points, mean (std) over seeds; *aggregated*: the "
                    f"same with each node's model right after aggregation." if show_worst else "")
                 + (" *Of which before round 1*: bytes received before the first round, counted where they "
                    "arrive: the setup exchange (Client2Vec's index) and the start-up announcements (one control "
                    "message from each peer to each node, so they grow with the square of the node count)."
                    if show_setup else ""))
    if show_certified:
        lines.append("")
        lines.append("*Nodes certified gaining*: with `algorithm.safeguard = \"local\"`, how many nodes deploy the "
                     "federated model after the last round because their validation split shows it better than their "
                     "Local model (a one-sided sign test at `algorithm.safeguard_level`), mean over seeds.")
    if show_paired:
        lines.append("")
        lines.append(f"*Δ vs {reference}*: the paired difference over seeds of the mean accuracy (this row − "
                     f"`{reference}`, same seed), in points, with its 95 % t interval, the paired t test's p and "
                     f"its value after Holm's correction over the table's {len(paired)} tests; *higher*/*lower* "
                     f"only where the corrected p < {LEVEL} over at least {MIN_SEEDS} seeds, else *level*.")
    defended = {label: runs[0].get("defences") for label, runs in rows.items() if runs and runs[0].get("defences")}
    if defended:
        lines.append("")
        lines.append("Runtime defences on in these runs, beside the algorithm: " + "; ".join(
            f"`{md_cell(label)}`: {' + '.join(on)}" for label, on in defended.items())
                     + " (runtime.update_bound, runtime.max_weight_ratio; off in a simulation unless the scenario sets them).")
    short = {label: sum(r.get("fell_back") or 0 for r in runs) for label, runs in rows.items()}
    short = {label: count for label, count in short.items() if count}
    if short:
        lines.append("")
        lines.append("**Warning**: rows whose strategy fell back (a robust rule with too few models kept the node's "
                     "own model): " + "; ".join(f"`{md_cell(label)}` in {count} node-rounds over its seeds"
                                                for label, count in short.items())
                     + ". Those rounds did not run the named rule.")
    note = per_node_test_note(rows)
    if note:
        lines.append("")
        lines.append(note)
    for label, picks in chosen_values(rows).items():
        if label in rows:
            lines.append("")
            lines.append(f"`{label}`: chosen per seed on the validation split (mean over nodes, last round, after "
                         "training): " + ", ".join(f"seed {seed} → `{pick}`" for seed, pick in sorted(picks.items()))
                         + ".")
    versions = sorted({str(r.get("code_version")) for runs in rows.values() for r in runs if r.get("code_version")})
    lines.append("")
    lines.append("Code version: " + (", ".join(versions) if versions else "not recorded (runs made before it was)") + ".")
    starved = starved_runs(rows)
    if starved:
        lines.append("")
        lines.append(f"**Not comparable:** in these runs over {100 * UNANSWERED_WARN_SHARE:.0f} % of the downloads asked "
                     "for in the second half of the rounds went unanswered (peers that died, or a machine too loaded "
                     "to answer within `runtime.fetch_timeout_s`); run them again alone: "
                     + ", ".join(starved) + ".")
    return "\n".join(lines)


def starved_runs(rows: Mapping[str, list[dict[str, Any]]]) -> list[str]:
    """`row seed N (x %)` for every run whose nodes went without over UNANSWERED_WARN_SHARE of
    the downloads they asked for in the second half of the rounds."""
    return [f"{label} seed {run.get('seed')} ({100 * run['unanswered_share']:.0f} %)"
            for label, runs in rows.items() for run in runs
            if (run.get("unanswered_share") or 0.0) > UNANSWERED_WARN_SHARE]


def choose_on_validation(row: Row, candidates: Mapping[str, Sequence[Mapping[str, Any]]]
                         ) -> tuple[list[dict[str, Any]], dict[int, str]]:
    """A sweep row's runs: per seed, the candidate run with the best mean validation accuracy
    (ties: the value listed first). Returns those summaries and seed -> chosen candidate label."""
    by_seed: dict[int, list[tuple[float, int, Mapping[str, Any]]]] = {}
    for order, candidate in enumerate(row.candidates):
        for run in candidates[candidate.label]:
            if run.get("val") is None:
                raise ConfigError("--algorithms", f"{candidate.label} seed {run.get('seed')} recorded no validation "
                                                  "accuracy (made before nodes recorded it, or its nodes have no validation "
                                                  "split): a sweep chooses on validation data")
            by_seed.setdefault(run["seed"], []).append((run["val"], -order, run))
    chosen_runs, chosen = [], {}
    for seed in sorted(by_seed):
        _, neg_order, run = max(by_seed[seed], key=lambda item: (item[0], item[1]))
        chosen[seed] = row.candidates[-neg_order].label
        chosen_runs.append({**run, "chosen": chosen[seed]})
    return chosen_runs, chosen


def sweep_table(row: Row, candidates: Mapping[str, Sequence[Mapping[str, Any]]], chosen: Mapping[int, str]) -> str:
    """Every value of a sweep: validation (what chooses) and test accuracy, and how often chosen."""
    lines = [f"Sweep of `{row.sweep_key}` in `{row.label}` (mean (std) over seeds; validation chooses, test reports):", "",
             "| row | validation % | avg % | avg aggregated % | chosen in seeds |", "|---|---|---|---|---|"]
    for candidate in row.candidates:
        runs = candidates[candidate.label]
        picked = [str(seed) for seed, label in sorted(chosen.items()) if label == candidate.label]
        lines.append(f"| {md_cell(candidate.label)} | {_cell([r['val'] for r in runs])} | {_cell([r['final'] for r in runs])} | "
                     f"{_cell([r['final_aggregated'] for r in runs])} | {', '.join(picked) or '-'} |")
    return "\n".join(lines)
