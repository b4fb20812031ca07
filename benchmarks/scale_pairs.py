"""The many-node row of `scale.py`, alternated between an older commit and this checkout, with a paired test.

    python benchmarks/scale_pairs.py --base 423af4c [--pairs 6] [--nodes 1000] [--set KEY=VALUE ...]

This machine's speed drifts by more than a small change moves a round (the same code's 1000-node
round has ranged from 7.2 to 12.5 s on different days), so a change is judged on pairs run back
to back: each pair runs

    python -m p2pfl run scenarios/scale.toml --set nodes=N --set runtime.topology="regular:4"

first in a git worktree of `--base` (made in a temporary folder for the run, and removed after),
then in this checkout. Each run starts in its checkout's own folder: a worker is
`python -m p2pfl worker`, which puts its working directory first on `sys.path`, so a run started
elsewhere (or pointed elsewhere by `PYTHONPATH`) would run the other checkout's nodes.

Per run it prints the slowest node's mean round (as `scale.py` reports it), the start-up
(launch to the last node's first round) and the CPU of the whole run (launcher and workers,
start-up included). Then, over the pairs, this checkout minus the base: the mean difference, its
standard deviation, and the two-sided p of a paired t-test (`scipy.stats.ttest_rel`). Run
folders are deleted after each run.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scipy import stats

ROOT = Path(__file__).resolve().parent.parent


def run_once(checkout: Path, out: Path, nodes: int, overrides: list[str]) -> dict[str, float]:
    """One run of the scale scenario started in `checkout`; its round, start-up and CPU seconds."""
    sets = [f"nodes={nodes}", 'runtime.topology="regular:4"', *overrides]
    command = [sys.executable, "-m", "p2pfl", "run", "scenarios/scale.toml", "--out", str(out), "--no-progress"]
    for item in sets:
        command += ["--set", item]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    launched = time.time()
    done = subprocess.run(command, cwd=checkout, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        if done.returncode != 0:
            raise SystemExit(f"the run in {checkout} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        results = json.loads((out / "results.json").read_text())
    finally:
        shutil.rmtree(out, ignore_errors=True)
    nodes_ = results["nodes"]
    if any(n["status"] != "ok" for n in nodes_):
        raise SystemExit(f"the run in {checkout}: not every node ended ok")
    return {
        "round_s": max(statistics.fmean(r["wall_s"] for r in n["rounds"]) for n in nodes_),
        "startup_s": max(n["rounds"][0]["started_at"] for n in nodes_) - launched,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
    }


def paired(label: str, base: list[float], new: list[float]) -> str:
    differences = [b - a for a, b in zip(base, new)]
    mean = statistics.fmean(differences)
    spread = statistics.stdev(differences) if len(differences) > 1 else float("nan")
    p = stats.ttest_rel(new, base).pvalue if len(differences) > 1 else float("nan")
    return (f"{label:<12} base {statistics.fmean(base):7.2f}   this {statistics.fmean(new):7.2f}   "
            f"difference {mean:+7.2f} ± {spread:.2f} (sd)   {mean / statistics.fmean(base):+.1%}   paired t-test p = {p:.3g}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the commit (or any git revision) to compare with")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    if args.pairs < 2:
        parser.error("--pairs must be at least 2 for a paired test")
    base_commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.base], check=True,
                                 capture_output=True, text=True).stdout.strip()
    this_commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], check=True,
                                 capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"], check=True,
                           capture_output=True, text=True).stdout.strip()
    print(f"{args.nodes} nodes, regular:4, {args.pairs} pairs: base {base_commit} against this checkout "
          f"({this_commit}{', with uncommitted changes' if dirty else ''})", flush=True)
    with tempfile.TemporaryDirectory(prefix="p2pfl-pairs-") as tmp:
        worktree = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(worktree), args.base],
                       check=True)
        try:
            runs: dict[str, list[dict[str, float]]] = {"base": [], "this": []}
            for i in range(1, args.pairs + 1):
                for label, checkout in (("base", worktree), ("this", ROOT)):
                    m = run_once(checkout, Path(tmp) / f"run-{label}-{i}", args.nodes, args.overrides)
                    runs[label].append(m)
                    print(f"pair {i} {label:<4}  s / round {m['round_s']:6.2f}   start-up s {m['startup_s']:6.1f}   "
                          f"CPU s {m['cpu_s']:6.1f}", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], check=False)
    for key, label in (("round_s", "s / round"), ("startup_s", "start-up s"), ("cpu_s", "CPU s")):
        print(paired(label, [m[key] for m in runs["base"]], [m[key] for m in runs["this"]]))


if __name__ == "__main__":
    main()
