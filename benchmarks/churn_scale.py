"""A thousand nodes with churn: each round 5 % of the live nodes crash and 5 % of the nodes join.

    python benchmarks/churn_scale.py [--out DIR] [--nodes 1000] [--rounds 6] [--rate 0.05] [--restart-after 2]
    python benchmarks/churn_scale.py --check DIR     # a finished run, checked again

`scenarios/scale.toml` (shared placement, colocated carrier, FedAvg, small CNN) on a random
4-regular graph, with `churn.join_per_round` and `churn.crash_per_round` at `--rate` (crashed nodes
come back `--restart-after` rounds later; 0: never). Then, from results.json: every node the
schedule has live in a round finished that round (has its record), but for the rounds a node
skipped because it came back (or joined) in the round its neighbours were already in; no node
failed; the live count and the events per round, and the mean round wall of the nodes that ran
each round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from p2pfl.runtime.churn import ChurnSpec, scripts_of
from p2pfl.runtime.config import node_ids
from p2pfl.scenario.launcher import run_loaded
from p2pfl.scenario.schema import load_scenario

ROOT = Path(__file__).resolve().parent.parent


def check(results: dict) -> int:
    sc = results["scenario"]
    spec = ChurnSpec.from_dict(sc.get("churn", {}), nodes=sc["nodes"], rounds=sc["rounds"])
    scripts = scripts_of(spec, sc["nodes"], sc["rounds"], sc["seed"])
    ids = node_ids(sc["nodes"])
    ran = {n["id"]: {r["round"] for r in n["rounds"]} for n in results["nodes"]}
    # A node that came back (or joined) in the round its neighbours were in, later than its
    # schedule's round, skipped the rounds between by design: counted apart.
    later: dict[str, set[int]] = {}
    for n in results["nodes"]:
        i = ids.index(n["id"])
        for e in n.get("membership") or []:
            planned = {"restarted": scripts[i].restart, "joined": scripts[i].join}.get(e["event"])
            if planned is not None and e["round"] > planned:
                later.setdefault(n["id"], set()).update(range(planned, e["round"]))
    statuses: dict[str, int] = {}
    for n in results["nodes"]:
        statuses[n["status"]] = statuses.get(n["status"], 0) + 1
    print(f"{sc['nodes']} nodes, {sc['rounds']} rounds, statuses {statuses}, wall {results['summary']['wall_s']:.1f} s")
    print(f"{'round':>5} {'scheduled':>9} {'finished':>8} {'joined':>6} {'crashed':>7} {'back':>5} {'s / round':>9}")
    missing = skipped = 0
    for entry in results["membership"]:
        r = entry["round"]
        scheduled = {ids[i] for i, s in enumerate(scripts) if s.live_in(r)}
        finished = {nid for nid, rounds in ran.items() if r in rounds}
        behind = {nid for nid in scheduled - finished if r in later.get(nid, set())}
        skipped += len(behind)
        missing += len(scheduled - finished - behind)
        walls = [x["wall_s"] for n in results["nodes"] for x in n["rounds"] if x["round"] == r]
        print(f"{r:>5} {len(scheduled):>9} {len(finished & scheduled):>8} {len(entry['joined']):>6} "
              f"{len(entry['crashed']):>7} {len(entry['restarted']):>5} {statistics.fmean(walls):>9.2f}")
    failed = statuses.get("failed", 0) + statuses.get("isolated", 0)
    print(f"node-rounds the schedule has and no record shows: {missing}; skipped by nodes that came back or joined "
          f"where their neighbours already were: {skipped}; failed or isolated nodes: {failed}")
    return 1 if missing or failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/churn_scale"))
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--rate", type=float, default=0.05)
    parser.add_argument("--restart-after", type=int, default=2)
    parser.add_argument("--check", type=Path, help="check a finished run folder instead of running")
    args = parser.parse_args()
    if args.check is not None:
        return check(json.loads((args.check / "results.json").read_text()))
    scenario = load_scenario(ROOT / "scenarios" / "scale.toml", [
        f"nodes={args.nodes}", f"rounds={args.rounds}", 'runtime.topology="regular:4"',
        f"churn.join_per_round={args.rate}", f"churn.crash_per_round={args.rate}",
        f"churn.restart_after={args.restart_after}"])
    results, code = run_loaded(scenario, args.out, progress=False, quiet=True, force=True)
    if code != 0:
        print(f"the run exited {code}", file=sys.stderr)
    return check(results) or code


if __name__ == "__main__":
    raise SystemExit(main())
