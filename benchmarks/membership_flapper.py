"""Issue 63, point 6: a member that leaves and comes back every round, against the same run without it.

scenarios/churn.toml (20 nodes, random 4-regular graph, 10 rounds, FedAvg), paired per seed: the
steady arm, and the same run with node 5 flapping from round 2 (`churn.flap`: a signed goodbye
before rounds 2, 4, 6, 8 and 10, back by its signed word in rounds 3, 5, 7 and 9). For each seed,
at the 19 other nodes: the rounds they finished (a lost round is one they did not), the slowest
round and the mean round (wall seconds: a neighbour that waited for the flapper would wait
`fetch_timeout_s`, 60 s), the parts they waited for and never got, and in the flapper's rounds how
many of its neighbours took its part.

    python benchmarks/membership_flapper.py --out ~/p2pfl-runs/membership_flapper --seeds 0,1,2,3,4
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from paired_arms import out_and_seeds, paired_runs

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "churn.toml"
FLAPPER, FROM = 5, 2
FLAP = [f"churn.flap=[{{node = {FLAPPER}, round = {FROM}}}]"]


def counts(results: dict[str, Any]) -> dict[str, Any]:
    flapper = next(n["id"] for n in results["nodes"] if int(n["id"].rsplit("-", 1)[1]) == FLAPPER)
    others = [n for n in results["nodes"] if n["id"] != flapper]
    walls = [r["wall_s"] for n in others for r in n["rounds"]]
    taken = {}
    for n in others:
        for r in n["rounds"]:
            if flapper in (r.get("arrived") or []):
                taken[r["round"]] = taken.get(r["round"], 0) + 1
    return {"rounds_finished": sum(len(n["rounds"]) for n in others),
            "rounds_due": len(others) * int(results["scenario"]["rounds"]), "slowest_s": max(walls), "mean_s": statistics.fmean(walls),
            "unanswered": sum(r.get("unanswered") or 0 for n in others for r in n["rounds"]),
            "status": sorted({n["status"] for n in others}),
            "flapper_taken": dict(sorted(taken.items()))}


def main() -> None:
    out, seeds = out_and_seeds(__doc__)
    table = paired_runs(SCENARIO, out, seeds, {"steady": [], "flapper": FLAP}, lambda results, _: counts(results),
                        "membership_flapper")
    print("\n| seed | rounds finished by the 19 others (steady / flapper run) | slowest round, s | mean round, s "
          "| parts waited for and not got | the flapper's part taken, by round |")
    print("|---|---|---|---|---|---|")
    for row in table:
        s, f = row["steady"], row["flapper"]
        taken = ", ".join(f"{r}: {k}" for r, k in f["flapper_taken"].items())
        print(f"| {row['seed']} | {s['rounds_finished']} / {f['rounds_finished']} of {f['rounds_due']} | {s['slowest_s']:.2f} / "
              f"{f['slowest_s']:.2f} | {s['mean_s']:.2f} / {f['mean_s']:.2f} | {s['unanswered']} / {f['unanswered']} "
              f"| {taken} |")


if __name__ == "__main__":
    main()
