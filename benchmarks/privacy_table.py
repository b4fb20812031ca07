"""Issue 64's privacy table: accuracy, accounted ε and what an audit measures, per privacy setting.

    python benchmarks/privacy_table.py OUT [--seeds 0,1,2,3,4] [--algorithm fedavg|pfedsv|pfedsv_dc] [--set F=V ...]
    python benchmarks/privacy_table.py OUT --table-only

On `scenarios/communication.toml` (10 Fashion-MNIST nodes, 1500 images a node, Dirichlet 0.5, 30
rounds of one epoch) with every run's node-0 keeping what it reads (`runtime.audit`): one
`p2pfl compare` per algorithm into OUT/<algorithm>, then `p2pfl audit` on every run that has no
audit.json yet (`--reuse` keeps finished runs and audits), then one table per algorithm. Rows:
privacy off; DP-SGD planned for ε = 4 (FedAvg also ε = 1 and 8); pFedSV's output noise at σ = 1
(clip 1); for FedAvg also top-k 1 % and int8 parts without privacy (does compressing leak less?).
Each row's paired difference against privacy off, over seeds, Holm within the table, for the test
accuracy and for the loss attack's membership AUC.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from p2pfl.audit.run import AuditSettings, audit_run
from p2pfl.core.paired import holm_corrected, paired_difference
from p2pfl.runtime.run_folder import compare_row_runs

# the scenario has no [privacy] table: privacy is off unless a row turns it on
DPSGD = 'privacy.mode="dp-sgd",privacy.target_epsilon={eps}'
NOISE = 'privacy.mode="output-noise",privacy.noise_multiplier=1.0,privacy.clip_norm=1.0'
ROWS = {
    "fedavg": ["fedavg", f"fedavg[{DPSGD.format(eps=4)}]", f"fedavg[{NOISE}]", f"fedavg[{DPSGD.format(eps=1)}]",
               f"fedavg[{DPSGD.format(eps=8)}]",
               'fedavg[runtime.wire_sparsity="topk:0.01"]', 'fedavg[runtime.wire_precision="int8"]'],
    "pfedsv": ["pfedsv", f"pfedsv[{DPSGD.format(eps=4)}]", f"pfedsv[{NOISE}]"],
    "pfedsv_dc": ["pfedsv[variant=D+C]", f"pfedsv[variant=D+C,{DPSGD.format(eps=4)}]", f"pfedsv[variant=D+C,{NOISE}]"],
}
SCENARIO = "scenarios/communication.toml"


def run(out: Path, algorithm: str, seeds: str, sets: list[str]) -> None:
    command = [sys.executable, "-m", "p2pfl", "compare", SCENARIO, "--seeds", seeds, "--out", str(out),
               "--algorithms", ",".join(ROWS[algorithm]), "--reference", ROWS[algorithm][0], "--reuse",
               "--no-progress", "--set", 'runtime.audit="node-0"', *[a for s in sets for a in ("--set", s)]]
    subprocess.run(command, check=True)
    for runs in compare_row_runs(out).values():
        for folder in runs:
            if (folder / "results.json").is_file() and not (folder / "audit.json").is_file():
                audit_run(folder, "node-0", AuditSettings())
                print(f"audited {folder}", flush=True)


def _seeds(runs: list[Path], read: object) -> dict[int, float]:
    out = {}
    for folder in runs:
        if (folder / "results.json").is_file() and (folder / "audit.json").is_file():
            out[int(folder.name.removeprefix("seed"))] = read(json.loads((folder / "results.json").read_text()),  # type: ignore[operator]
                                                              json.loads((folder / "audit.json").read_text()))
    return out


COLUMNS = {
    "acc %": lambda r, a: 100 * statistics.fmean(n["final_test_acc"] for n in r["nodes"]),
    "ε accounted": lambda r, a: max((n["final_epsilon"] for n in r["nodes"] if isinstance(n.get("final_epsilon"), (int, float))),
                                    default=float("nan")),
    "AUC loss": lambda r, a: a["summary"]["membership_auc_loss"],
    "AUC shadow": lambda r, a: a["summary"]["membership_auc_shadow"],
    "advantage": lambda r, a: a["summary"]["membership_advantage"],
    "ε proven ≥": lambda r, a: a["summary"]["epsilon_lower_bound"],
    "update PSNR dB": lambda r, a: a["summary"]["update_psnr"] if a["summary"]["update_psnr"] is not None else float("nan"),
}


def table(out: Path, reference: str) -> str:
    runs = compare_row_runs(out)
    values = {row: {col: _seeds(folders, read) for col, read in COLUMNS.items()} for row, folders in runs.items()}
    tests = {key: holm_corrected({row: paired_difference(v[col], values[reference][col])
                                  for row, v in values.items() if row != reference})
             for key, col in (("acc", "acc %"), ("auc", "AUC loss"))}
    head = ["row", "seeds", *COLUMNS, "Δ acc vs off, points", "Δ AUC loss vs off, ×100"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row, cols in values.items():
        cells = []
        for col in COLUMNS:
            finite = [v for v in cols[col].values() if v == v]
            cells.append(f"{statistics.fmean(finite):.3g}" if finite else "-")
        diffs = [tests[k][row].cell(scale) if row in tests[k] else "reference" for k, scale in (("acc", 1.0), ("auc", 100.0))]
        lines.append(f"| `{row}` | {len(cols['acc %'])} | " + " | ".join(cells + diffs) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--algorithm", action="append", choices=sorted(ROWS), default=None)
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args()
    for algorithm in args.algorithm or sorted(ROWS):
        folder = args.out / algorithm
        if not args.table_only:
            run(folder, algorithm, args.seeds, args.sets)
        if (folder / "compare.json").is_file():
            print(f"\n{algorithm}\n\n{table(folder, ROWS[algorithm][0])}")


if __name__ == "__main__":
    main()
