"""The poisoning table of docs/security.md from the compare folders that scenarios/poisoning.toml's
comment makes: each attack × each row, with the norm bound and without it.

    python benchmarks/poisoning_table.py [runs/poison]

Reads ROOT/clean_b{0,1} and ROOT/{noise,signflip1000,labelflip}_b{0,1}; prints the table (and
writes it to ROOT/poisoning_grid.md), then, per bounded folder, how far over the bound honest
and attacking parts lay (`peers_bounded_factor`; a refused part's factor from its refusal) and
in how many node-rounds each was refused: what runtime.update_refuse is chosen between.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from p2pfl.report.tables import poisoning_grid_table

ATTACKS = {"noise": "noise", "sign-flip ×1000": "signflip1000", "label-flip": "labelflip"}


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/poison")
    table = poisoning_grid_table({0.0: root / "clean_b0", 1.0: root / "clean_b1"},
                                 {name: {0.0: root / f"{slug}_b0", 1.0: root / f"{slug}_b1"}
                                  for name, slug in ATTACKS.items() if (root / f"{slug}_b0" / "compare.json").is_file()})
    (root / "poisoning_grid.md").write_text(table + "\n")
    print(table)
    print()
    print("| folder | honest parts: most times over the bound | attacker: times over (min-max) | "
          "refused node-rounds: honest, attacker |")
    print("|---|---|---|---|")
    for folder in sorted(root.glob("*_b1")):
        honest, attacker, refused = 0.0, [], [0, 0]
        for results in sorted(folder.glob("*/seed*/results.json")):
            run = json.loads(results.read_text())
            attackers = {f"node-{i}" for i in (run["scenario"].get("attack") or {}).get("nodes", [])}
            for node in run["nodes"]:
                for record in node["rounds"]:
                    for peer, factor in (record.get("peers_bounded_factor") or {}).items():
                        if peer in attackers:
                            attacker.append(factor)
                        else:
                            honest = max(honest, factor)
                    for peer, why in (record.get("peers_refused") or {}).items():
                        refused[peer in attackers] += 1
                        over = re.search(r"(\d+) times over", why)
                        if over and peer in attackers:
                            attacker.append(float(over.group(1)))
        spread = f"{min(attacker):.1f}-{max(attacker):.0f}" if attacker else "-"
        print(f"| {folder.name} | {honest:.1f} | {spread} | {refused[0]}, {refused[1]} |")


if __name__ == "__main__":
    main()
