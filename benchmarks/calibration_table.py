"""Issue 62's calibration table: each test-split reading's cheap rows against pFedSV's paper.

    bash benchmarks/calibration.sh ~/p2pfl-runs/calibration 0,1
    python benchmarks/calibration_table.py ~/p2pfl-runs/calibration [--out docs/calibration.md]

Reads the compare folders `benchmarks/calibration.sh` writes (`<OUT>/dirichlet`, `<OUT>/pathological`,
rows `local` and `fedavg`). Each run scored its models on every reading (`data.test_split` =
own_distribution, `data.extra_test_splits` the others), so a reading's cell is that of a run made
with it as `test_split` (tests/runtime/test_extra_test_splits.py). A cell is the mean over nodes at
the last round, then over seeds (± the standard deviation over seeds); the paper's cell is paper 003's
Fashion-MNIST 10-client number with its ± ("the error range of the MTA after 5 repeated
experiments"); `off by` is how far ours lies outside that band (0: inside).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from p2pfl.data.spec import TEST_SPLITS
from p2pfl.runtime.run_folder import compare_row_runs

# paper 003, Table I (pathological) and Table II (Dirichlet 0.1), Fashion-MNIST, 10 clients: (mean, ±)
PAPER = {
    ("dirichlet", "Separate"): (60.18, 6.42), ("dirichlet", "FedAvg"): (40.58, 4.16),
    ("dirichlet", "FedAvg+FT"): (57.27, 4.13),
    ("pathological", "Separate"): (92.35, 0.43), ("pathological", "FedAvg+FT"): (91.18, 3.54),
    # pathological FedAvg: the cell is garbled in the text (Table I's LaTeX array lost its numbers)
}
# (the paper's row, our compare row, which of its accuracies)
ROWS = (("Separate", "local", "after training"), ("FedAvg", "fedavg", "aggregated"),
        ("FedAvg+FT", "fedavg", "after training"))


def node_accuracy(record: dict, reading: str, which: str) -> float:
    if reading == "own_distribution":
        return record["test_acc" if which == "after training" else "test_acc_aggregated"]
    key = "test_acc_by_split" if which == "after training" else "test_acc_aggregated_by_split"
    return record[key][reading]


def run_accuracy(run: Path, reading: str, which: str) -> float:
    nodes = json.loads((run / "results.json").read_text())["nodes"]
    return 100 * statistics.fmean(node_accuracy(n["rounds"][-1], reading, which) for n in nodes)


def row_runs(folder: Path) -> dict[str, list[Path]] | None:
    """Row -> its run folders: compare.json's once the compare ended, plan.json's while it runs."""
    if (folder / "compare.json").is_file():
        return compare_row_runs(folder)
    if (folder / "plan.json").is_file():
        plan = json.loads((folder / "plan.json").read_text())
        return {row: [folder / run for run in runs] for row, runs in plan["runs"].items()}
    return None


def cells(folder: Path) -> list[dict]:
    out = []
    for partition in ("dirichlet", "pathological"):
        runs = row_runs(folder / partition)
        if runs is None:
            continue
        for reading in TEST_SPLITS:
            for paper_row, row, which in ROWS:
                done = [run for run in runs.get(row, []) if (run / "results.json").is_file()]
                if not done:
                    continue
                per_seed = {run.name: run_accuracy(run, reading, which) for run in done}
                mean = statistics.fmean(per_seed.values())
                sd = statistics.stdev(per_seed.values()) if len(per_seed) > 1 else 0.0
                paper = PAPER.get((partition, paper_row))
                off = None if paper is None else max(0.0, abs(mean - paper[0]) - paper[1])
                out.append({"partition": partition, "reading": reading, "row": paper_row, "ours": mean, "sd": sd,
                            "seeds": sorted(per_seed), "per_seed": per_seed, "paper": paper, "off_by": off})
    return out


def markdown(rows: list[dict]) -> str:
    lines = ["| partition | test split | row | ours % (± sd over seeds) | seeds | paper % (±) | off by |",
             "|---|---|---|---|---|---|---|"]
    for c in rows:
        paper = "garbled in the text" if c["paper"] is None else f"{c['paper'][0]:.2f} ± {c['paper'][1]:.2f}"
        off = "–" if c["off_by"] is None else ("inside" if c["off_by"] == 0 else f"{c['off_by']:.1f}")
        lines.append(f"| {c['partition']} | {c['reading']} | {c['row']} | {c['ours']:.1f} ± {c['sd']:.1f} | "
                     f"{len(c['seeds'])} | {paper} | {off} |")
    lines += ["", "| test split | cells inside the paper's band | summed distance outside it (points) |", "|---|---|---|"]
    for reading in TEST_SPLITS:
        judged = [c for c in rows if c["reading"] == reading and c["off_by"] is not None]
        if judged:
            inside = sum(c["off_by"] == 0 for c in judged)
            lines.append(f"| {reading} | {inside} of {len(judged)} | {sum(c['off_by'] for c in judged):.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="the OUT folder of benchmarks/calibration.sh")
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here, and its cells as JSON beside it")
    args = parser.parse_args()
    rows = cells(args.folder)
    if not rows:
        raise SystemExit(f"{args.folder}: no finished run under dirichlet/ or pathological/")
    table = markdown(rows)
    print(table, end="")
    if args.out:
        args.out.write_text(table)
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
