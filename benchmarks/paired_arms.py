"""Paired runs for the membership benchmarks: per seed, the same scenario once per arm (each
arm its own `--set` overrides), a folder per arm and seed under OUT, read back instead of run
again when its results are there."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from p2pfl.scenario.launcher import run_scenario


def out_and_seeds(doc: str | None) -> tuple[Path, list[int]]:
    """`--out OUT --seeds 0,1,2,3,4`, the membership benchmarks' command line."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", default="0,1,2,3,4")
    args = parser.parse_args()
    return args.out, [int(s) for s in args.seeds.split(",")]


def paired_runs(scenario: Path, out: Path, seeds: Sequence[int], arms: Mapping[str, Sequence[str]],
                summarize: Callable[[dict[str, Any], int], dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """A row per seed: {"seed": s, arm: summarize(results, exit code), ...}, printed as it comes and
    kept in OUT/<name>.json."""
    table: list[dict[str, Any]] = []
    for seed in seeds:
        row: dict[str, Any] = {"seed": seed}
        for arm, overrides in arms.items():
            folder = out / f"{arm}-seed{seed}"
            if (folder / "results.json").is_file():  # made already: read, not run again
                results, code = json.loads((folder / "results.json").read_text()), 0
            else:
                results, code = run_scenario(scenario, folder, [f"seed={seed}", *overrides], progress=False, quiet=True)
            row[arm] = summarize(results, code)
            print(seed, arm, row[arm], flush=True)
        table.append(row)
    (out / f"{name}.json").write_text(json.dumps(table, indent=1, default=str))
    return table
