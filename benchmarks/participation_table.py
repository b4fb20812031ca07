"""Partial participation from a finished run's results: per round, who took part, how long they
waited for peers, and whether any download went unanswered.

    p2pfl run scenarios/scale.toml --out runs/scale_p10 --set nodes=1000 --set rounds=4 \\
      --set runtime.participation=0.1 --set 'runtime.topology="regular:4"'
    python benchmarks/participation_table.py runs/scale_p10

A round "waits on a timeout" when a download asked for went unanswered (`unanswered`) or a
participant waited for peers as long as `runtime.fetch_timeout_s`.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run folder (its results.json)")
    args = parser.parse_args()
    results = json.loads((args.run / "results.json").read_text())
    nodes = results["nodes"]
    ok = sum(n["status"] == "ok" for n in nodes)
    spans = [(r["started_at"], r["started_at"] + r["wall_s"]) for n in nodes for r in n["rounds"]]
    span = max(e for _, e in spans) - min(s for s, _ in spans)
    rounds = max(len(n["rounds"]) for n in nodes)
    print(f"{ok} of {len(nodes)} nodes ok, wall {results['summary']['wall_s']:.1f} s; all {rounds} rounds within "
          f"{span:.1f} s ({span / rounds:.1f} s a round); fetch timeout {results['scenario']['runtime']['fetch_timeout_s']:g} s")
    print(f"{'round':<7}{'participants':>13}{'round wall p50 / max s':>24}{'waiting p50 / max s':>21}"
          f"{'asked':>7}{'arrived':>9}{'unanswered':>12}{'left out':>10}")
    every = []
    for k in range(rounds):
        taking = [n["rounds"][k] for n in nodes if len(n["rounds"]) > k and n["rounds"][k].get("participated", True)]
        if not taking:
            continue
        every += taking
        wall = [r["wall_s"] for r in taking]
        wait = [r["time"]["exchange_s"] for r in taking]
        print(f"{k + 1:<7}{len(taking):>13}{statistics.median(wall):>13.1f} / {max(wall):<8.1f}"
              f"{statistics.median(wait):>10.1f} / {max(wait):<8.1f}{sum(r['asked'] for r in taking):>7}"
              f"{sum(len(r['arrived']) for r in taking):>9}{sum(r['unanswered'] for r in taking):>12}"
              f"{sum(len(r.get('sat_out', [])) for r in taking):>10}")
    wall = [r["wall_s"] for r in every]
    print(f"all rounds: {len(every) / rounds:.1f} participants a round; a participant's round {statistics.median(wall):.1f} s "
          f"median, {max(wall):.1f} s at most; {sum(r['asked'] for r in every)} downloads asked for, "
          f"{sum(len(r['arrived']) for r in every)} arrived, {sum(r['unanswered'] for r in every)} unanswered")


if __name__ == "__main__":
    main()
