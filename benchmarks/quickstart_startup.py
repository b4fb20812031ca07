"""The quickstart's start-up with its node processes forked from one import against spawned as
fresh interpreters (`runtime.start_method`), in paired runs.

    python benchmarks/quickstart_startup.py [--pairs 5] [--scenario scenarios/quickstart.toml]

Each pair runs `p2pfl run SCENARIO` twice, once per start method, in an order that alternates
from pair to pair (so that neither always runs on a warmer page cache). Printed per run: the
start-up the run reports (`summary.startup_s`: launch to the first round a node finished),
the command's whole wall from outside, and the CPU seconds of it and of every process it waited
for (the launcher, the forking parent, the nodes: `getrusage` of the children); then, over the
pairs, the median of each and the median of the per-pair ratios spawn / fork. Both methods must
print the same accuracies (the same run), which the script checks. Run it on a quiet machine: it
measures time.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("spawn", "fork")


def _children_cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def one_run(scenario: Path, out: Path, method: str) -> tuple[float, float, float, float]:
    """(start-up s, whole wall s, CPU s, mean final accuracy) of one run."""
    began, cpu = time.perf_counter(), _children_cpu_s()
    subprocess.run([sys.executable, "-m", "p2pfl", "run", str(scenario), "--out", str(out), "--force",
                    "--no-progress", "--set", f'runtime.start_method="{method}"'],
                   check=True, capture_output=True, cwd=ROOT)
    wall, cpu = time.perf_counter() - began, _children_cpu_s() - cpu
    summary = json.loads((out / "results.json").read_text())["summary"]
    return float(summary["startup_s"]), wall, cpu, float(summary["mean_acc"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "quickstart.toml")
    args = parser.parse_args()
    runs: dict[str, list[tuple[float, float, float, float]]] = {m: [] for m in METHODS}
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            order = METHODS if pair % 2 == 0 else METHODS[::-1]
            for method in order:
                startup, wall, cpu, acc = one_run(args.scenario.resolve(), Path(tmp) / method, method)
                runs[method].append((startup, wall, cpu, acc))
                print(f"pair {pair + 1}, {method:5s}: start-up {startup:5.2f} s, whole run {wall:5.2f} s, "
                      f"CPU {cpu:5.2f} s, "
                      f"mean acc {100 * acc:.1f} %", flush=True)
    accs = {m: {round(r[3], 6) for r in runs[m]} for m in METHODS}
    if accs["spawn"] != accs["fork"] or len(accs["fork"]) != 1:
        raise SystemExit(f"the two start methods ran different runs: accuracies {accs}")
    for i, what in ((0, "start-up"), (1, "whole run"), (2, "CPU")):
        spawn, fork = [r[i] for r in runs["spawn"]], [r[i] for r in runs["fork"]]
        ratios = [s / f for s, f in zip(spawn, fork)]
        print(f"{what}: spawn median {statistics.median(spawn):.2f} s, fork median {statistics.median(fork):.2f} s; "
              f"spawn / fork per pair: median {statistics.median(ratios):.2f}x (min {min(ratios):.2f}, "
              f"max {max(ratios):.2f}) over {args.pairs} pairs")


if __name__ == "__main__":
    main()
