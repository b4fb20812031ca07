"""The same seed, the same run: a scenario run twice, and the first round where the two differ.

Compares every node's per-round records that must not depend on timing (accuracies, training
loss, who was asked and who answered; `p2pfl.scenario.results.SAME_RUN_KEYS`), not bytes or
times. With `--runs A B` it compares two finished run folders instead.

    python benchmarks/same_seed.py scenarios/pfedsv_dirichlet.toml --set seed=1 --out runs/same_seed
    python benchmarks/same_seed.py --runs runs/same_seed/a runs/same_seed/b
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from p2pfl.scenario.launcher import run_loaded
from p2pfl.scenario.results import first_difference
from p2pfl.scenario.schema import load_scenario


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", nargs="?", type=Path)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", type=Path, default=Path("runs/same_seed"))
    parser.add_argument("--runs", nargs=2, type=Path, metavar=("A", "B"), help="compare two finished runs")
    args = parser.parse_args()
    if args.runs:
        folders = args.runs
    elif args.scenario is not None:
        scenario = load_scenario(args.scenario, args.set)
        folders = [args.out / "a", args.out / "b"]
        for folder in folders:  # one after the other: a run beside another is slower, not different
            results, _ = run_loaded(scenario, folder, quiet=True, force=True)
            print(f"{folder}: mean acc {100 * results['summary']['mean_acc']:.2f} %, "
                  f"{results['summary']['wall_s']:.0f} s", file=sys.stderr)
    else:
        parser.error("give a scenario to run twice, or --runs A B")
    a, b = (json.loads((folder / "results.json").read_text()) for folder in folders)
    difference = first_difference(a, b)
    if difference is None:
        rounds = sum(len(n.get("rounds", [])) for n in a["nodes"])
        print(f"the same run: {len(a['nodes'])} nodes, {rounds} node rounds, every record alike")
        return 0
    round_, nodes = difference
    print(f"the runs part in round {round_}, on {', '.join(nodes)}")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
