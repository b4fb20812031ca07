"""Issue 63: a churn run with one lying member, against the same run without the lie.

scenarios/churn.toml (20 nodes, random 4-regular graph, 10 rounds) with three members leaving
(goodbyes: stand-ins are drawn) and two crashing (one comes back), paired per seed: the honest arm,
and the same schedule with node 0 publishing `membership-lie` news every round (every other member
"left", itself "joined"). For each seed it counts, at the honest nodes:

* neighbours lost: members replaced while live (neither a leaver nor a crashed node at that time);
* stand-in draws: how often the liar was drawn as a stand-in, against the mean over honest members.

    python benchmarks/membership_liar.py --out ~/p2pfl-runs/membership_liar --seeds 0,1,2,3,4
"""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from paired_arms import out_and_seeds, paired_runs

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "churn.toml"
LIAR = 0  # node indices (ids are zero-padded: node-00)
LEAVERS = {5: 3, 9: 5, 13: 7}  # say goodbye instead of running this round
CRASHES = {2: (4, None), 11: (6, 8)}  # stop dead before this round (back in the second)
CHURN = [
    "churn.leave=[" + ", ".join(f"{{node = {n}, round = {r}}}" for n, r in LEAVERS.items()) + "]",
    "churn.crash=[" + ", ".join(f"{{node = {n}, round = {r}" + (f", restart = {b}}}" if b else "}")
                                for n, (r, b) in CRASHES.items()) + "]",
]
LIE = ['attack.kind="membership-lie"', "attack.nodes=[0]"]


def index(node_id: str) -> int:
    return int(node_id.rsplit("-", 1)[1])


def gone_at(member: str, round_: int) -> bool:
    """Whether `member` was away (left, or down after a crash) when replaced in `round_`."""
    member = index(member)  # type: ignore[assignment]
    if member in LEAVERS and round_ >= LEAVERS[member] - 1:
        return True
    if member in CRASHES:
        crash, back = CRASHES[member]
        return round_ >= crash - 1 and (back is None or round_ < back + 1)
    return False


def counts(results: dict[str, Any]) -> dict[str, Any]:
    lost, drawn = 0, Counter[str]()
    for node in results["nodes"]:
        if index(node["id"]) == LIAR:
            continue
        for record in node["rounds"]:
            for gone, stand_in in (record.get("neighbours") or {}).get("replaced", {}).items():
                drawn[stand_in] += 1
                lost += not gone_at(gone, record["round"])
    honest = [n["id"] for n in results["nodes"] if index(n["id"]) != LIAR]
    liar = next(n["id"] for n in results["nodes"] if index(n["id"]) == LIAR)
    return {"neighbours_lost": lost, "liar_drawn": drawn[liar], "drawn": {m: drawn[m] for m in honest},
            "honest_drawn_mean": statistics.fmean(drawn[m] for m in honest), "draws": sum(drawn.values()),
            "status": Counter(n["status"] for n in results["nodes"])}


def main() -> None:
    out, seeds = out_and_seeds(__doc__)
    table = paired_runs(SCENARIO, out, seeds, {"honest": CHURN, "liar": [*CHURN, *LIE]},
                        lambda results, code: {**counts(results), "exit": code}, "membership_liar")
    print("\n| seed | neighbours lost (honest / liar run) | liar drawn as stand-in | honest member drawn (mean) |")
    print("|---|---|---|---|")
    for row in table:
        h, lie = row["honest"], row["liar"]
        print(f"| {row['seed']} | {h['neighbours_lost']} / {lie['neighbours_lost']} | {lie['liar_drawn']} of "
              f"{lie['draws']} | {lie['honest_drawn_mean']:.2f} |")
    totals = Counter[str]()
    for row in table:
        totals.update(row["liar"]["drawn"])
    each = sorted(totals.values())
    print(f"\nOver {len(table)} seeds the liar was drawn {sum(r['liar']['liar_drawn'] for r in table)} times; each "
          f"honest member {each[0]} to {each[-1]} times (median {each[len(each) // 2]}).")


if __name__ == "__main__":
    main()
