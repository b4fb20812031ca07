"""Nodes that come and go (issue 45): the three experiments of docs/experiments.md, at 5 seeds.

    python benchmarks/churn_experiments.py --out ~/p2pfl-runs/churn [--seeds 0,1,2,3,4] [--only a,b,c]
        [--algorithms fedavg,pfedsv]

(a) Joining: 20 nodes from the start, 5 more (nodes 20-24) join in round 5. The joiners' mean
    test accuracy in round 8 (their fourth round, three after the one they joined in) against
    the median of the 20 that were there from the start, and against joiners that start from
    the initial weights (`churn.catch_up = false`).
(b) Crashing: 4 of 20 nodes (20 %: nodes 3, 8, 13, 18) crash before round 5 and stay down. The
    16 survivors' mean final accuracy, and the wall from the first round's start to the last
    round's end, against the same run without the crashes (the same 16 nodes).
(c) Stragglers: 4 of 20 nodes (one in five, drawn by the seed) train 10 times slower. Wall to the
    last round (all nodes, and the 16 others alone) and mean final accuracy of the 16 others: waiting for the slow ones
    (`runtime.accept_stale = false`, fetch_timeout_s 60), taking their newest (stale) part when
    the current one is late (`accept_stale = true`, fetch_timeout_s 1), and the same with stale
    parts weighed down ((1 + τ)^-0.5: `staleness = 0.5`, FedAvg only: ours). It times runs: run
    it alone on the machine.

Every run is `scenarios/churn.toml` with the arm's overrides, run by the launcher in shared
placement; a run folder already finished with the same scenario is taken as it is (`--out`
keeps them). Tables print as markdown, each with paired differences over seeds and Holm's
correction within the table; a claim is higher or lower only where the corrected p < 0.05.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from p2pfl.core.paired import holm, paired_difference
from p2pfl.scenario.launcher import run_loaded
from p2pfl.scenario.schema import load_scenario, scenario_differences

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "churn.toml"
JOIN_ROUND, MEASURED_ROUND = 5, 8
JOINERS = [f"node-{i}" for i in range(20, 25)]
CRASHED = [3, 8, 13, 18]
Arm = tuple[str, list[str]]  # (name, overrides)

ARMS: dict[str, list[Arm]] = {
    "a": [("catch-up", ["nodes=25", f"churn.join=[{', '.join(f'{{node = {i}, round = {JOIN_ROUND}}}' for i in range(20, 25))}]"]),
          ("from initial weights", ["nodes=25", f"churn.join=[{', '.join(f'{{node = {i}, round = {JOIN_ROUND}}}' for i in range(20, 25))}]",
                                    "churn.catch_up=false"])],
    "b": [("no crash", []),
          ("20 % crash", [f"churn.crash=[{', '.join(f'{{node = {i}, round = 5}}' for i in CRASHED)}]"])],
    "c": [("wait", ["churn.slow_share=0.2", "churn.slow_factor=10.0", "runtime.accept_stale=false"]),
          ("stale", ["churn.slow_share=0.2", "churn.slow_factor=10.0", "runtime.accept_stale=true",
                     "runtime.fetch_timeout_s=1.0"]),
          ("stale, weighed", ["churn.slow_share=0.2", "churn.slow_factor=10.0", "runtime.accept_stale=true",
                              "runtime.fetch_timeout_s=1.0", "algorithm.params.staleness=0.5"])],
}
PFEDSV = ["algorithm.name=pfedsv", "algorithm.params.k=3"]


def run(out: Path, algorithm: str, arm: Arm, seed: int) -> dict[str, Any]:
    name, overrides = arm
    if algorithm == "pfedsv" and any("staleness" in o for o in overrides):
        raise ValueError("the staleness weight is FedAvg's and FedProx's")
    scenario = load_scenario(SCENARIO, [f"seed={seed}", *(PFEDSV if algorithm == "pfedsv" else []), *overrides])
    folder = out / algorithm / name.replace(" ", "_").replace(",", "").replace("%", "pct") / f"seed{seed}"
    done = folder / "results.json"
    if done.is_file():
        results = json.loads(done.read_text())
        if not scenario_differences(results["scenario"], scenario):
            return results
    results, code = run_loaded(scenario, folder, progress=False, quiet=True, force=True)
    if code != 0:
        print(f"warning: {folder}: exit {code}", file=sys.stderr)
    return results


def acc_in(node: Mapping[str, Any], round_: int) -> float | None:
    return next((r["test_acc"] for r in node["rounds"] if r["round"] == round_), None)


def final_acc(results: Mapping[str, Any], ids: Sequence[str]) -> float:
    return statistics.fmean(n["final_test_acc"] for n in results["nodes"] if n["id"] in ids)


def wall_to_last_round(results: Mapping[str, Any]) -> float:
    rounds = [r for n in results["nodes"] for r in n["rounds"]]
    return max(r["started_at"] + r["wall_s"] for r in rounds) - min(r["started_at"] for r in rounds)


def originals(results: Mapping[str, Any], excluded: Sequence[str]) -> list[str]:
    return [n["id"] for n in results["nodes"] if n["id"] not in excluded]


def table(title: str, metrics: Mapping[str, Callable[[Mapping[str, Any]], float]], rows: Mapping[str, dict[int, Any]],
          pairs: Sequence[tuple[str, str, str]], scale: Mapping[str, float]) -> str:
    """Means (std) over seeds per row and metric, then each pair's paired difference, Holm-corrected."""
    lines = [f"#### {title}", "", "| row | " + " | ".join(metrics) + " |", "|---|" + "---|" * len(metrics)]
    values = {row: {m: {s: f(r) for s, r in by_seed.items()} for m, f in metrics.items()} for row, by_seed in rows.items()}
    for row in rows:
        cells = []
        for m in metrics:
            xs = [v * scale[m] for v in values[row][m].values() if v is not None]
            cells.append(f"{statistics.fmean(xs):.2f} ({statistics.stdev(xs):.2f})" if len(xs) > 1 else "-")
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    tests = {}
    for a, b, m in pairs:
        tests[(a, b, m)] = paired_difference(values[a][m], values[b][m])
    adjusted = holm({f"{a}|{b}|{m}": d.p_value for (a, b, m), d in tests.items()})
    lines += ["", "| difference | metric | mean [95 % CI] | p | Holm p | verdict |", "|---|---|---|---|---|---|"]
    for (a, b, m), d in tests.items():
        p_holm, significant = adjusted[f"{a}|{b}|{m}"]
        verdict = ("higher" if d.mean > 0 else "lower") if significant and len(d.seeds) >= 5 else "level"
        lines.append(f"| {a} − {b} | {m} | {d.mean * scale[m]:+.2f} [{d.low * scale[m]:+.2f}, {d.high * scale[m]:+.2f}] "
                     f"| {d.p_value:.2g} | {p_holm:.2g} | {verdict} |")
    return "\n".join(lines) + "\n"


def experiment_a(out: Path, algorithms: Sequence[str], seeds: Sequence[int]) -> str:
    rows: dict[str, dict[int, Any]] = {}
    for algorithm in algorithms:
        for arm in ARMS["a"]:
            rows[f"{algorithm}, {arm[0]}"] = {s: run(out, algorithm, arm, s) for s in seeds}
    metrics = {
        "joiners, round 8 (%)": lambda r: statistics.fmean(acc_in(n, MEASURED_ROUND) for n in r["nodes"] if n["id"] in JOINERS),
        "median of the first 20, round 8 (%)": lambda r: statistics.median(
            acc_in(n, MEASURED_ROUND) for n in r["nodes"] if n["id"] not in JOINERS),
    }
    # The joiners' accuracy less the original nodes' median, per run: a metric of its own, for the pair test.
    metrics["joiners − median (points)"] = lambda r: (metrics["joiners, round 8 (%)"](r)
                                                      - metrics["median of the first 20, round 8 (%)"](r))
    pairs = []
    for algorithm in algorithms:
        pairs.append((f"{algorithm}, catch-up", f"{algorithm}, from initial weights", "joiners, round 8 (%)"))
    text = table("(a) 5 nodes join 20 in round 5", metrics, rows, pairs, dict.fromkeys(metrics, 100.0))
    one_sample = {}  # the joiners against the median: the per-seed difference tested against 0
    for algorithm in algorithms:
        for arm in ARMS["a"]:
            label = f"{algorithm}, {arm[0]}"
            diffs = {s: metrics["joiners − median (points)"](r) for s, r in rows[label].items()}
            one_sample[label] = paired_difference(diffs, dict.fromkeys(diffs, 0.0))
    adjusted = holm({k: d.p_value for k, d in one_sample.items()})
    text += "\n| joiners − median of the first 20, round 8 | mean [95 % CI] | p | Holm p | verdict |\n|---|---|---|---|---|\n"
    for label, d in one_sample.items():
        p_holm, significant = adjusted[label]
        verdict = ("higher" if d.mean > 0 else "lower") if significant and len(d.seeds) >= 5 else "level"
        text += (f"| {label} | {100 * d.mean:+.2f} [{100 * d.low:+.2f}, {100 * d.high:+.2f}] | {d.p_value:.2g} | "
                 f"{p_holm:.2g} | {verdict} |\n")
    return text


def experiment_b(out: Path, algorithms: Sequence[str], seeds: Sequence[int]) -> str:
    rows: dict[str, dict[int, Any]] = {}
    for algorithm in algorithms:
        for arm in ARMS["b"]:
            rows[f"{algorithm}, {arm[0]}"] = {s: run(out, algorithm, arm, s) for s in seeds}
    crashed = [f"node-{i:02d}" for i in CRASHED]
    metrics = {"survivors' final accuracy (%)": lambda r: final_acc(r, originals(r, crashed)),
               "wall to the last round (s)": wall_to_last_round}
    pairs = [(f"{a}, 20 % crash", f"{a}, no crash", m) for a in algorithms for m in metrics]
    return table("(b) 4 of 20 nodes crash before round 5", metrics, rows, pairs,
                 {"survivors' final accuracy (%)": 100.0, "wall to the last round (s)": 1.0})


def experiment_c(out: Path, algorithms: Sequence[str], seeds: Sequence[int]) -> str:
    rows: dict[str, dict[int, Any]] = {}
    for algorithm in algorithms:
        for arm in ARMS["c"]:
            if algorithm != "pfedsv" or "staleness" not in " ".join(arm[1]):
                rows[f"{algorithm}, {arm[0]}"] = {s: run(out, algorithm, arm, s) for s in seeds}

    def slow_ones(r: Mapping[str, Any]) -> list[str]:
        from p2pfl.runtime.churn import ChurnSpec, scripts_of

        spec = ChurnSpec.from_dict(r["scenario"]["churn"], nodes=r["scenario"]["nodes"], rounds=r["scenario"]["rounds"])
        scripts = scripts_of(spec, r["scenario"]["nodes"], r["scenario"]["rounds"], r["scenario"]["seed"])
        return [n["id"] for n, s in zip(r["nodes"], scripts) if s.slowdown > 1]

    metrics = {"wall to the last round (s)": wall_to_last_round,
               "the others' wall to their last round (s)": lambda r: wall_to_last_round(
                   {"nodes": [n for n in r["nodes"] if n["id"] not in slow_ones(r)]}),
               "final accuracy of the others (%)": lambda r: final_acc(r, originals(r, slow_ones(r))),
               "stale parts taken per node-round": lambda r: statistics.fmean(
                   len(x.get("stale", [])) for n in r["nodes"] for x in n["rounds"])}
    pairs = []
    for a in algorithms:
        for m in list(metrics)[:3]:
            pairs.append((f"{a}, stale", f"{a}, wait", m))
            if a != "pfedsv":
                pairs.append((f"{a}, stale, weighed", f"{a}, stale", m))
    return table("(c) one node in five at a tenth of the speed", metrics, rows, pairs,
                 {"wall to the last round (s)": 1.0, "the others' wall to their last round (s)": 1.0,
                  "final accuracy of the others (%)": 100.0, "stale parts taken per node-round": 1.0})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--only", default="a,b,c")
    parser.add_argument("--algorithms", default="fedavg,pfedsv")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    algorithms = args.algorithms.split(",")
    experiments = {"a": experiment_a, "b": experiment_b, "c": experiment_c}
    for key in args.only.split(","):
        text = experiments[key](args.out, algorithms, seeds)
        print(text, flush=True)
        (args.out / f"table_{key}.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
