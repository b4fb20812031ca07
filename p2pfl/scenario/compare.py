"""`p2pfl compare`: every algorithm row over every seed, as a paper-style table.

Cells are mean (std) over seeds of the unweighted mean over nodes (the papers do not
weight by sample count; `weighted_acc` in results.json does). Both evaluation points are
shown: after local training (`test_acc`, the deployed model) and right after aggregation
(`test_acc_aggregated`; FedAvg's global model).
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

from p2pfl.errors import ConfigError
from p2pfl.runtime.run_folder import RunFolder, compare_run, row_slug
from p2pfl.scenario.results import UNANSWERED_WARN_SHARE, download_health, download_warning
from p2pfl.scenario.schema import (Scenario, apply_overrides, apply_values, parse_override, read_raw, scenario_differences,
                                   scenario_from_dict)


MAX_NODE_COLUMNS = 12
SETUP_COLUMN_MIN_BYTES = 0.05 * 2**20  # shows as 0.1 MiB


@dataclass(frozen=True)
class Row:
    """One table row: an algorithm, its parameters, and scenario overrides (keys with a dot)."""

    label: str
    algorithm: str
    params: Mapping[str, Any] = field(default_factory=dict)
    overrides: Mapping[str, Any] = field(default_factory=dict)

    @property
    def slug(self) -> str:
        return row_slug(self.label)


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
    rows = []
    for token in _split_top_level(text):
        match = re.fullmatch(r"([A-Za-z0-9_+-]+)(?:\[(.*)\])?", token)
        if not match:
            raise ConfigError("--algorithms", f"cannot parse {token!r}; expected name or name[key=value,...]")
        params, overrides = {}, {}
        for item in _split_top_level(match.group(2) or ""):
            path, value = parse_override(item)
            (overrides if len(path) > 1 or isinstance(value, dict) else params)[".".join(path)] = value
        rows.append(Row(token, match.group(1), params, overrides))
    return rows


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    values = [v for v in values if v is not None]
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
        for r in n.get("rounds", []):
            per_round.setdefault(r["round"], []).append(r["test_acc"])
            per_round_agg.setdefault(r["round"], []).append(r["test_acc_aggregated"])
    mean_by_round = {r: statistics.fmean(v) for r, v in per_round.items()}
    agg_by_round = {r: statistics.fmean(v) for r, v in per_round_agg.items()}
    labels = [n.get("domain") or n["id"] for n in nodes]
    if len(set(labels)) != len(labels):  # several nodes per domain: "3 usps"
        labels = [n["id"].replace("node-", "") + (f" {n['domain']}" if n.get("domain") else "") for n in nodes]
    return {
        "seed": seed,
        "node_labels": labels,
        "node_acc": [n.get("final_test_acc") for n in nodes],
        "node_acc_aggregated": [n.get("final_test_acc_aggregated") for n in nodes],
        "final": results["summary"]["mean_acc"],
        "best": max(mean_by_round.values()) if mean_by_round else None,
        "final_aggregated": results["summary"].get("mean_acc_aggregated"),
        "best_aggregated": max(agg_by_round.values()) if agg_by_round else None,
        "total_bytes": results["summary"]["total_bytes"],
        "total_param_bytes": results["summary"].get("total_param_bytes"),
        "setup_bytes": setup_bytes(results),
        "held_out_acc": results["summary"].get("held_out_acc"),
        "epsilon": results["summary"].get("max_epsilon"),
        "wall_s": results["summary"]["wall_s"],
        # From the nodes' rounds, so that runs made before the summary kept it are checked too.
        "unanswered_share": download_health(nodes)["unanswered_share_second_half"],
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


def format_table(rows: Mapping[str, list[dict[str, Any]]], baseline: str | None = None) -> str:
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
    # Every run has control messages before round 1 (a few hundred bytes per node); a column that
    # would read 0.0 MiB in every row says nothing, so it appears for an index-sized exchange only.
    show_setup = any(statistics.fmean(r.get("setup_bytes") or 0 for r in runs) >= SETUP_COLUMN_MIN_BYTES
                     for runs in rows.values())
    head += ["MiB sent", *(["of which before round 1"] if show_setup else []), "seeds"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, runs in rows.items():
        cells = [label]
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
        cells.append(f"{statistics.fmean(r['total_bytes'] for r in runs) / 2**20:.1f}")
        if show_setup:
            cells.append(f"{statistics.fmean(r.get('setup_bytes') or 0 for r in runs) / 2**20:.1f}")
        cells.append(str(len(runs)))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Test accuracy in percent, mean (std) over seeds, of the mean over nodes after the last round; "
                 "*best round*: the round with the highest mean, picked on the test split (optimistic); "
                 "*aggregated*: the model right after aggregation."
                 + (f" *worst vs {baseline_name}*: per seed, the minimum over nodes of the node's accuracy minus the same "
                    f"node's `{baseline}` accuracy (same seed), in points, mean (std) over seeds; *aggregated*: the "
                    f"same with each node's model right after aggregation." if show_worst else "")
                 + (" *Of which before round 1*: bytes received before the first round, counted where they "
                    "arrive: the setup exchange (Client2Vec's index) and the start-up announcements (one control "
                    "message from each peer to each node, so they grow with the square of the node count)."
                    if show_setup else ""))
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


def _stored_run(run_dir: Path, scenario: Scenario, label: str) -> dict[str, Any] | None:
    """The results.json `--reuse` takes for one run, or None where there is none; a run of
    another scenario, or made on other data, is refused (ConfigError on `--reuse`)."""
    from p2pfl.scenario.launcher import scenario_data_fingerprint

    if not RunFolder(run_dir).results.is_file():
        return None
    stored = json.loads(RunFolder(run_dir).results.read_text())
    differ = scenario_differences(stored.get("scenario") or {}, scenario)
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


def earlier_rows(out: Path, base: Mapping[str, Any], scenario_path: Path, seeds: Sequence[int],
                 asked: Sequence[str]) -> dict[str, list[dict[str, Any]] | None]:
    """The rows out/compare.json lists, in its order: those this call asks for map to None
    (this call fills them in), the others to their summaries where every seed's run is there and
    still matches this call's scenario, so that a folder gathers its rows over several calls.
    Rows that no longer match are left out, saying why."""
    listing = out / "compare.json"
    if not listing.is_file():
        return {}
    kept: dict[str, list[dict[str, Any]] | None] = {}
    for label in json.loads(listing.read_text()).get("rows", {}):
        if label in asked:
            kept[label] = None
            continue
        try:
            (row,) = parse_algorithms(label)
            runs = [_stored_run(compare_run(out, label, seed), _row_scenario(base, row, seed, scenario_path), label)
                    for seed in seeds]
        except (ConfigError, ValueError) as exc:
            print(f"compare.md leaves out the earlier row {label!r}: {exc}", file=sys.stderr)
            continue
        missing = [seed for seed, run in zip(seeds, runs) if run is None]
        if missing:
            print(f"compare.md leaves out the earlier row {label!r}: no run for seed(s) "
                  f"{', '.join(map(str, missing))}", file=sys.stderr)
            continue
        kept[label] = [summarize_run(run) for run in runs if run is not None]
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


def run_compare(scenario_path: Path, rows: list[Row], seeds: list[int], out: Path, overrides: Sequence[str] = (),
                *, reuse: bool = False, progress: bool = True) -> int:
    """Run (or with `reuse`, take) every row over every seed and write compare.json and
    compare.md. With `reuse` the table also keeps the rows earlier calls put in `out` (see
    `earlier_rows`): this call's rows in its order, each earlier row back after the row it
    followed before."""
    from p2pfl.scenario.launcher import run_loaded

    base = apply_overrides(read_raw(scenario_path), overrides)
    # Validate every row, and every run --reuse would take, before the first run starts.
    plans = []
    for row in rows:
        for seed in seeds:
            scenario = _row_scenario(base, row, seed, scenario_path)
            run_dir = compare_run(out, row.label, seed)
            stored = _stored_run(run_dir, scenario, row.label) if reuse else None
            plans.append((row, seed, scenario, run_dir, stored))
    earlier = earlier_rows(out, base, scenario_path, seeds, [row.label for row in rows]) if reuse else {}
    out.mkdir(parents=True, exist_ok=True)
    summaries: dict[str, list[dict[str, Any]]] = {row.label: [] for row in rows}
    failures = 0
    for row, seed, scenario, run_dir, stored in plans:
        if stored is not None:
            results, code = stored, 0 if not stored["summary"]["nodes_failed"] else 1
        else:
            results, code = run_loaded(scenario, run_dir, progress=progress, quiet=True, force=True)
        failures += code != 0
        summaries[row.label].append(summarize_run(results))
        s = summaries[row.label][-1]
        print(f"{row.label} seed {seed}: acc {100 * s['final']:.1f} % (aggregated {100 * s['final_aggregated']:.1f} %), "
              f"{s['total_bytes'] / 2**20:.1f} MiB, {s['wall_s']:.0f} s" + ("" if code == 0 else "  [FAILED NODES]"),
              file=sys.stderr)
        warning = download_warning(download_health(results["nodes"]))
        if warning is not None:
            print(f"{row.label} seed {seed}: {warning}", file=sys.stderr)
    summaries = {label: summaries[label] if earlier.get(label) is None else earlier[label]
                 for label in table_order(list(summaries), list(earlier))}
    table = format_table(summaries)
    (out / "compare.json").write_text(json.dumps({"scenario": str(scenario_path), "seeds": seeds,
                                                  "overrides": list(overrides), "rows": summaries}, indent=1))
    (out / "compare.md").write_text(table + "\n")
    print(table)
    return 1 if failures else 0
