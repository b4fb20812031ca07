"""The poisoning table of docs/security.md from the compare folders that scenarios/poisoning.toml's
comment makes: each attack × each row, with the norm bound and without it.

    python benchmarks/poisoning_table.py [runs/poison]

Reads ROOT/clean_b{0,1} and ROOT/{noise,signflip1000,labelflip}_b{0,1}; prints the table (and
writes it to ROOT/poisoning_grid.md).
"""

from __future__ import annotations

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


if __name__ == "__main__":
    main()
