"""`p2pfl compare`: every algorithm row over every seed, as a paper-style table.

Cells are mean (std) over seeds of the unweighted mean over nodes (the papers do not
weight by sample count; `weighted_acc` in results.json does). Both evaluation points are
shown: after local training (`test_acc`, the deployed model) and right after aggregation
(`test_acc_aggregated`; FedAvg's global model).

A row may sweep one hyperparameter, `fedc2i[gamma=0.5|1|2|5|10]`: every value runs as its own
row (`fedc2i[gamma=0.5]`, ...), and for each seed the value with the best mean validation
accuracy over nodes (final round, after training) stands for the row, as the papers choose
theirs; the test split never chooses. With `reference`, each row gets its paired difference
over seeds against that row (`p2pfl.core.paired`).
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from p2pfl.core.paired import LEVEL, MIN_SEEDS, PairedDifference, holm_corrected, paired_difference
from p2pfl.errors import ConfigError
from p2pfl.runtime.run_folder import RunFolder, compare_run, row_slug
from p2pfl.scenario.results import (UNANSWERED_WARN_SHARE, active_defences, degraded_warning, download_health, download_warning,
                                    refusal_warning, refused_peers)
from p2pfl.scenario.schema import (Scenario, apply_overrides, apply_values, parse_override, read_raw, scenario_differences,
                                   scenario_from_dict)
from p2pfl.runtime.node.records import TEST_ACC_AGGREGATED, after_training, final_accuracies, last_trained


MAX_NODE_COLUMNS = 12
SETUP_COLUMN_MIN_BYTES = 0.05 * 2**20  # shows as 0.1 MiB


@dataclass(frozen=True)
class Row:
    """One table row: an algorithm, its parameters, and scenario overrides (keys with a dot)."""

    label: str
    algorithm: str
    params: Mapping[str, Any] = field(default_factory=dict)
    overrides: Mapping[str, Any] = field(default_factory=dict)
    # A sweep row (`gamma=0.5|1|2`): the swept key and one row per value, chosen among on validation.
    sweep_key: str | None = None
    candidates: tuple[Row, ...] = ()

    @property
    def slug(self) -> str:
        return row_slug(self.label)

    def runs(self) -> tuple[Row, ...]:
        """The rows whose runs this row needs: its candidates, or itself."""
        return self.candidates or (self,)


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def parse_algorithms(text: str) -> list[Row]:
    """`fedavg,fedc2i[gamma=1,variant=-lambda],pfedsv[privacy.noise_multiplier=1]` -> rows.

    Inside brackets a plain key is an algorithm parameter; a dotted key overrides the
    scenario for that row (privacy noise, data split, ...), and a key set to an inline table
    replaces that whole table of the scenario: `local[privacy={mode="none"}]` is Local with
    privacy off, whatever `[privacy]` the scenario has.
    """
    return [_parse_row(token) for token in _split_top_level(text)]


def _is_sweep(item: str) -> bool:
    value = item.split("=", 1)[1].strip() if "=" in item else ""
    return "|" in value and not value.startswith(("\"", "'", "[", "{"))


def _parse_row(token: str) -> Row:
    # A built-in's name, or a user's strategy as "package.module:Class".
    match = re.fullmatch(r"([A-Za-z0-9_+-]+|[A-Za-z_][\w.]*:[A-Za-z_]\w*)(?:\[(.*)\])?", token)
    if not match:
        raise ConfigError("--algorithms", f"cannot parse {token!r}; expected name, package.module:Class, "
                                          "or either with [key=value,...]")
    name, items = match.group(1), _split_top_level(match.group(2) or "")
    swept = [i for i, item in enumerate(items) if _is_sweep(item)]
    if len(swept) > 1:
        raise ConfigError("--algorithms", f"{token!r} sweeps {len(swept)} keys; a row sweeps one hyperparameter "
                                          "(write one row per setting of the others)")
    if swept:
        key, alternatives = items[swept[0]].split("=", 1)
        values = [v.strip() for v in alternatives.split("|")]
        if len(values) < 2 or not all(values) or len(set(values)) != len(values):
            raise ConfigError("--algorithms", f"{token!r}: a sweep lists two or more distinct values, "
                                              f"like {key.strip()}=0.5|1|2")
        candidates = tuple(_parse_row(f"{name}[{','.join(items[:swept[0]] + [f'{key.strip()}={v}'] + items[swept[0] + 1:])}]")
                           for v in values)
        return Row(token, name, sweep_key=key.strip(), candidates=candidates)
    params, overrides = {}, {}
    for item in items:
        path, value = parse_override(item)
        (overrides if len(path) > 1 or isinstance(value, dict) else params)[".".join(path)] = value
    return Row(token, name, params, overrides)


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


def label_algorithm(label: str) -> str:
    """The algorithm of a row label: `local[privacy={mode="none"}]` -> `local`."""
    return label.split("[", 1)[0]


def baseline_label(labels: Sequence[str], algorithm: str = "local") -> str | None:
    """The row the `worst vs local` columns measure against: the row labelled `local`, else the one
    row of algorithm `local` (`local[privacy={mode="none"}]` in a privacy sweep); None if neither."""
    if algorithm in labels:
        return algorithm
    candidates = [label for label in labels if label_algorithm(label) == algorithm]
    return candidates[0] if len(candidates) == 1 else None


def md_cell(text: str) -> str:
    """A table cell's text with the pipes of a sweep (`gamma=1|5`) escaped for Markdown."""
    return text.replace("|", "\\|")


PAIRED_KEYS = ("final", "final_aggregated")
PLAN_FILE = "plan.json"  # the runs a compare call is making: row -> run folders (the dashboard's progress)


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


def row_raw(base: Mapping[str, Any], row: Row) -> dict[str, Any]:
    """The raw scenario of one row: the base with the row's algorithm, parameters and overrides
    (the base's algorithm parameters carry over only to a row of the same algorithm)."""
    raw = json.loads(json.dumps(base))
    base_algorithm = base.get("algorithm", {}).get("name", "fedavg")
    params = dict(raw.get("algorithm", {}).get("params", {})) if row.algorithm == base_algorithm else {}
    raw["algorithm"] = {"name": row.algorithm, "params": params}
    return apply_values(raw, [(["algorithm", "params", k], v) for k, v in row.params.items()]
                        + [(k.split("."), v) for k, v in row.overrides.items()])


# How many processes host the nodes: it changes a run's wall, not what its nodes compute, so a
# run made on a machine with more cores is reused (its results.json keeps the value it had).
HOSTING_ONLY = frozenset({"runtime.workers"})


def _stored_run(run_dir: Path, scenario: Scenario, label: str) -> dict[str, Any] | None:
    """The results.json `--reuse` takes for one run, or None where there is none or where a node
    of it failed (a run cut short runs again); a run of another scenario, or made on other data,
    is refused (ConfigError on `--reuse`)."""
    from p2pfl.scenario.results import scenario_data_fingerprint

    if not RunFolder(run_dir).results.is_file():
        return None
    stored = json.loads(RunFolder(run_dir).results.read_text())
    summary = stored.get("summary") or {}
    failed = (summary.get("nodes_failed") or []) + (summary.get("nodes_stopped") or [])
    if failed:
        print(f"{label}: {run_dir} has failed nodes ({', '.join(failed[:3])}{', …' if len(failed) > 3 else ''}); "
              "running it again", file=sys.stderr)
        return None
    differ = [f for f in scenario_differences(stored.get("scenario") or {}, scenario) if f not in HOSTING_ONLY]
    if differ:
        raise ConfigError("--reuse", f"{run_dir} was run with another scenario than row {label!r} "
                                     f"asks for ({', '.join(differ[:5])} differ); move it away or pick "
                                     "another --out")
    made_on, here = stored.get("data_fingerprint"), scenario_data_fingerprint(scenario)
    if made_on is not None and made_on != here:  # older runs carry none: nothing to check
        raise ConfigError("--reuse", f"{run_dir} was run on other data than this machine makes ({made_on} "
                                     f"there, {here} here: synth depends on the Pillow and matplotlib versions and on "
                                     "the fonts $P2PFL_FONT_DIRS adds); install the pinned versions, or run it again")
    return stored


def _row_scenario(base: Mapping[str, Any], row: Row, seed: int, scenario_path: Path) -> Scenario:
    raw = row_raw(base, row)
    raw["seed"] = seed
    return scenario_from_dict(raw, source=str(scenario_path))


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


def earlier_overrides(out: Path) -> dict[str, list[str]]:
    """Per row out/compare.json lists, the `--set` overrides its runs were made with. A listing
    written before rows kept their own holds the overrides of the call that wrote it, and every
    row it kept matched them then."""
    listing = out / "compare.json"
    if not listing.is_file():
        return {}
    document = json.loads(listing.read_text())
    common = list(document.get("overrides", []))
    per_row = document.get("row_overrides", {})
    return {label: list(per_row.get(label, common)) for label in document.get("rows", {})}


def earlier_rows(out: Path, scenario_path: Path, seeds: Sequence[int],
                 asked: Sequence[str]) -> dict[str, list[dict[str, Any]] | None]:
    """The rows out/compare.json lists, in its order: those this call asks for map to None
    (this call fills them in), the others to their summaries where every seed's run is there and
    still matches the scenario with the overrides that row was made with (`earlier_overrides`:
    one folder gathers rows made by several calls, each with its own `--set`, such as
    Client2Vec's rows that read an index another row built). Rows that no longer match are left
    out, saying why."""
    kept: dict[str, list[dict[str, Any]] | None] = {}
    raw = read_raw(scenario_path)
    for label, overrides in earlier_overrides(out).items():
        if label in asked:
            kept[label] = None
            continue
        try:
            (row,) = parse_algorithms(label)
            base = apply_overrides(raw, overrides)
            stored = {candidate.label: [_stored_run(compare_run(out, candidate.label, seed),
                                                    _row_scenario(base, candidate, seed, scenario_path), label)
                                        for seed in seeds] for candidate in row.runs()}
        except (ConfigError, ValueError) as exc:
            print(f"compare.md leaves out the earlier row {label!r}: {exc}", file=sys.stderr)
            continue
        missing = sorted({seed for runs in stored.values() for seed, run in zip(seeds, runs) if run is None})
        if missing:
            print(f"compare.md leaves out the earlier row {label!r}: no run for seed(s) "
                  f"{', '.join(map(str, missing))}", file=sys.stderr)
            continue
        summaries = {candidate: [summarize_run(run) for run in runs if run is not None] for candidate, runs in stored.items()}
        if row.candidates:
            try:
                kept[label] = choose_on_validation(row, summaries)[0]
            except ConfigError as exc:
                print(f"compare.md leaves out the earlier row {label!r}: {exc}", file=sys.stderr)
        else:
            kept[label] = summaries[label]
    return kept


def table_order(asked: Sequence[str], earlier: Sequence[str]) -> list[str]:
    """The rows asked for in their order, each earlier row not asked for put back right after
    the row it followed in `earlier` (first if it came first)."""
    order, previous = list(asked), None
    for label in earlier:
        if label not in order:
            order.insert(0 if previous is None else order.index(previous) + 1, label)
        previous = label
    return order


def check_out_folder(out: Path, *, reuse: bool, force: bool) -> None:
    """ConfigError on `--out` where it names a file, or a folder holding runs while neither
    `--reuse` nor `--force` says what to do with them."""
    if reuse and force:
        raise ConfigError("--force", "--force runs again what --reuse would take; pass one of them")
    if out.exists() and not out.is_dir():
        raise ConfigError("--out", f"{out} is a file; name a folder for the comparison")
    if reuse or force or not out.is_dir():
        return
    held = next(out.glob("*/*/results.json"), None) or (out / "compare.json" if (out / "compare.json").is_file() else None)
    if held is not None:
        raise ConfigError("--out", f"{out} holds runs of an earlier comparison ({held}); pass --reuse to take them "
                                   "and run only what is missing, or --force to run everything again, replacing them")


def run_compare(scenario_path: Path, rows: list[Row], seeds: list[int], out: Path, overrides: Sequence[str] = (),
                *, reuse: bool = False, force: bool = False, progress: bool = True,
                reference: str | None = None) -> int:
    """Run (or with `reuse`, take) every row over every seed and write compare.json and
    compare.md. A sweep row runs each of its values and stands for the one validation chooses
    per seed. With `reuse` the table also keeps the rows earlier calls put in `out` (see
    `earlier_rows`): this call's rows in its order, each earlier row back after the row it
    followed before. `reference` names the row every other row's paired difference is taken
    against. A folder that holds runs is refused unless `reuse` takes them or `force` runs them
    again, as `p2pfl run` refuses an existing run without `--force`."""
    from p2pfl.scenario.launcher import run_loaded

    check_out_folder(out, reuse=reuse, force=force)
    base = apply_overrides(read_raw(scenario_path), overrides)
    if reference is not None and reference not in [row.label for row in rows]:
        earlier_labels = list(json.loads((out / "compare.json").read_text()).get("rows", {})) \
            if reuse and (out / "compare.json").is_file() else []
        if reference not in earlier_labels:
            raise ConfigError("--reference", f"{reference!r} is not one of the rows: "
                                             + ", ".join([row.label for row in rows] + earlier_labels))
    # Validate every run, and every run --reuse would take, before the first run starts; a run
    # two rows need (a sweep's value asked for as a row of its own too) runs once.
    plans: dict[Path, tuple[Row, int, Scenario, dict[str, Any] | None]] = {}
    for row in rows:
        for candidate in row.runs():
            for seed in seeds:
                run_dir = compare_run(out, candidate.label, seed)
                if run_dir in plans:
                    continue
                scenario = _row_scenario(base, candidate, seed, scenario_path)
                stored = _stored_run(run_dir, scenario, candidate.label) if reuse else None
                plans[run_dir] = (candidate, seed, scenario, stored)
    earlier = earlier_rows(out, scenario_path, seeds, [row.label for row in rows]) if reuse else {}
    made_with = earlier_overrides(out) if reuse else {}
    out.mkdir(parents=True, exist_ok=True)
    # What this call will run, for a live view of the folder (compare.json comes at the end).
    planned: dict[str, list[str]] = {}
    for run_dir, (row, _, _, _) in plans.items():
        planned.setdefault(row.label, []).append(str(run_dir.relative_to(out)))
    (out / PLAN_FILE).write_text(json.dumps({"scenario": str(scenario_path), "overrides": list(overrides),
                                             "runs": planned}, indent=1))
    runs: dict[str, list[dict[str, Any]]] = {}
    failures = 0
    for run_dir, (row, seed, scenario, stored) in plans.items():
        if stored is not None:
            results, code = stored, 0 if not stored["summary"]["nodes_failed"] else 1
        else:
            results, code = run_loaded(scenario, run_dir, progress=progress, quiet=True, force=True)
        failures += code != 0
        runs.setdefault(row.label, []).append(summarize_run(results))
        s = runs[row.label][-1]
        print(f"{row.label} seed {seed}: acc {100 * s['final']:.1f} % (aggregated {100 * s['final_aggregated']:.1f} %), "
              f"{s['total_bytes'] / 2**20:.1f} MiB, {s['wall_s']:.0f} s" + ("" if code == 0 else "  [FAILED NODES]"),
              file=sys.stderr)
        for warning in (download_warning(download_health(results["nodes"])),
                        refusal_warning(refused_peers(results["nodes"])),
                        degraded_warning((results["summary"].get("nodes_degraded") or {}))):
            if warning is not None:
                print(f"{row.label} seed {seed}: {warning}", file=sys.stderr)
    summaries: dict[str, list[dict[str, Any]]] = {}
    sweeps = []
    for row in rows:
        if row.candidates:
            summaries[row.label], picks = choose_on_validation(row, runs)
            sweeps.append(sweep_table(row, runs, picks))
        else:
            summaries[row.label] = runs[row.label]
    summaries = {label: summaries[label] if earlier.get(label) is None else earlier[label]
                 for label in table_order(list(summaries), list(earlier))}
    table = "\n\n".join([format_table(summaries, reference=reference), *sweeps])
    asked = [row.label for row in rows]
    row_overrides = {label: list(overrides) if label in asked else made_with[label] for label in summaries}
    (out / "compare.json").write_text(json.dumps({"scenario": str(scenario_path), "seeds": seeds,
                                                  "overrides": list(overrides), "row_overrides": row_overrides,
                                                  "reference": reference, "chosen": chosen_values(summaries),
                                                  "rows": summaries}, indent=1))
    (out / "compare.md").write_text(table + "\n")
    print(table)
    return 1 if failures else 0
