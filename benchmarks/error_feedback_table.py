"""Error feedback on against off, at each sparsity of a communication compare folder.

    p2pfl compare scenarios/communication.toml --seeds 0,1,2,3,4 --out runs/communication_fedavg ...
    python benchmarks/error_feedback_table.py runs/communication_fedavg

`compare --reference` pairs every row with one reference (float32); this pairs each top-k row
with error feedback (the default) against the same row without it, by seed, after training and
after aggregation, with Holm's correction over this table's tests (`p2pfl.core.paired`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from p2pfl.core.paired import holm_corrected, paired_difference
from p2pfl.runtime.run_folder import compare_row_runs
from p2pfl.scenario.compare import summarize_run

OFF = ",runtime.error_feedback=false"


def summaries(runs: list[Path]) -> list[dict]:
    return [summarize_run(json.loads((run / "results.json").read_text())) for run in runs]


def by_seed(runs: list[dict], key: str) -> dict[int, float]:
    return {int(s["seed"]): s[key] for s in runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="a compare folder holding top-k rows with and without error feedback")
    args = parser.parse_args()
    rows = compare_row_runs(args.folder)
    pairs = [(label, label.replace(OFF, "")) for label in rows if OFF in label and label.replace(OFF, "") in rows]
    if not pairs:
        raise SystemExit(f"{args.folder}: no row with '{OFF.lstrip(',')}' beside the same row without it")
    tests = {}
    for off, on in pairs:
        with_feedback, without = summaries(rows[on]), summaries(rows[off])
        for key, what in (("final", "after training"), ("final_aggregated", "after aggregation")):
            tests[on, what] = paired_difference(by_seed(with_feedback, key), by_seed(without, key))
    corrected = holm_corrected({f"{on} {what}": d for (on, what), d in tests.items()})
    print("| row | Δ error feedback on − off, after training | Δ after aggregation |")
    print("|---|---|---|")
    for _, on in pairs:
        print(f"| {on} | {corrected[f'{on} after training'].cell()} | {corrected[f'{on} after aggregation'].cell()} |")
    print(f"\nPoints, paired by seed, 95 % t interval, p and Holm's p over the table's {len(tests)} tests.")


if __name__ == "__main__":
    main()
