"""Issue 64's privacy table: accuracy, accounted ε and what an audit measures, per privacy setting.

    python benchmarks/privacy_table.py OUT [--seeds 0,1,2,3,4] [--algorithm fedavg|pfedsv|pfedsv_dc] [--set F=V ...]
    python benchmarks/privacy_table.py OUT --table-only [--summary FILE]
    python benchmarks/privacy_table.py --from-summary benchmarks/results/privacy_table.json

On `scenarios/communication.toml` (10 Fashion-MNIST nodes, 1500 images a node, Dirichlet 0.5, 30
rounds of one epoch) with every run's node-0 keeping what it reads (`runtime.audit`): one
`p2pfl compare` per algorithm into OUT/<algorithm>, then `p2pfl audit` on every run that has no
audit.json yet (`--reuse` keeps finished runs and audits), then one table per algorithm. Rows:
privacy off; DP-SGD planned for ε = 4 (FedAvg also ε = 1 and 8); pFedSV's output noise at σ = 1
(clip 1); for FedAvg also top-k 1 % and int8 parts without privacy (does compressing leak less?).
Each row's paired difference against privacy off, over seeds, Holm within the table, for the test
accuracy and for the loss attack's membership AUC.

`--summary FILE` also writes every finished run's cells (row, seed, column: a few numbers, where a
run folder is about 100 MB) so that the table is drawn again on a machine without the run folders:
`benchmarks/results/privacy_table.json` holds those behind docs/privacy.md.
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


Values = dict[str, dict[str, dict[int, float]]]  # row -> column -> seed -> value


def measured(out: Path) -> Values:
    """Every finished and audited run's cells, row by row in compare.json's order."""
    return {row: {col: _seeds(folders, read) for col, read in COLUMNS.items()}
            for row, folders in compare_row_runs(out).items()}


def table(values: Values, reference: str) -> str:
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
    parser.add_argument("out", type=Path, nargs="?")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--algorithm", action="append", choices=sorted(ROWS), default=None)
    parser.add_argument("--set", dest="sets", action="append", default=[])
    parser.add_argument("--table-only", action="store_true")
    parser.add_argument("--summary", type=Path, help="also write the tables' cells to this JSON file (merged by algorithm)")
    parser.add_argument("--from-summary", type=Path, help="draw the tables from such a file instead of run folders")
    args = parser.parse_args()
    if args.from_summary is not None:
        for algorithm, rows in json.loads(args.from_summary.read_text()).items():
            values = {row: {col: {int(s): float("nan") if v is None else v for s, v in seeds.items()}
                            for col, seeds in cols.items()} for row, cols in rows.items()}
            print(f"\n{algorithm}\n\n{table(values, ROWS[algorithm][0])}")
        return
    if args.out is None:
        parser.error("OUT is needed unless --from-summary is given")
    saved = json.loads(args.summary.read_text()) if args.summary is not None and args.summary.is_file() else {}
    for algorithm in args.algorithm or sorted(ROWS):
        folder = args.out / algorithm
        if not args.table_only:
            run(folder, algorithm, args.seeds, args.sets)
        if (folder / "compare.json").is_file():
            values = measured(folder)
            print(f"\n{algorithm}\n\n{table(values, ROWS[algorithm][0])}")
            saved[algorithm] = {row: {col: {seed: None if v != v else v for seed, v in seeds.items()}  # NaN: null
                                      for col, seeds in cols.items()} for row, cols in values.items()}
    if args.summary is not None:
        args.summary.parent.mkdir(parents=True, exist_ok=True)
        args.summary.write_text(json.dumps(saved, indent=1, ensure_ascii=False, allow_nan=False) + "\n")


if __name__ == "__main__":
    main()
