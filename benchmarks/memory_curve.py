"""Peak memory, start-up and round time against the number of nodes on this machine (issue 66).

    python benchmarks/memory_curve.py [--nodes 1000,3000,5000,10000] [--limit-gb 21]
        [--json benchmarks/results/memory_curve.json] [--figure docs/memory_curve.png] [--set KEY=VALUE ...]
    python benchmarks/memory_curve.py --from benchmarks/results/memory_curve.json --figure docs/memory_curve.png

With churn (each round 5 % of the nodes join and 5 % crash, back two rounds later), the folder
kept and checked as `benchmarks/churn_scale.py` checks its own:

    python benchmarks/memory_curve.py --nodes 10000 --out runs/curve --set rounds=6 \
        --set churn.join_per_round=0.05 --set churn.crash_per_round=0.05 --set churn.restart_after=2
    python benchmarks/churn_scale.py --check runs/curve/nodes-10000

Each size runs the scale scenario as anyone would, in a process of its own:

    python -m p2pfl run scenarios/scale.toml --out RUN --no-progress --set nodes=N --set 'runtime.topology="regular:4"'

while this script sums the RSS of that process and every process below it every 0.2 s. A run
whose total passes `--limit-gb` is stopped by its own pids (SIGTERM to each, SIGKILL to what is
left 10 s later), so that it cannot take the machine down, and its row says so with how far it
got. Per size: start-up (launch to the moment the last node began round 1), the first round
(launch to the moment the last node finished it), s per round (the slowest node's mean round),
the peak GB (summed RSS), and the nodes that ended ok; the rows also keep when the first and the
median node began round 1, and the peak summed PSS (`peak_pss_gb`: pages the processes share,
the forking parent's imports, counted once; read near the RSS peak only, at most every 2 s, as
reading it costs the run (`scale.PssReads`), with the summed RSS at that read,
`pss_read_at_rss_gb`) with each process's share at that moment
(`at_peak`: the launcher, the forking parent and each worker, by PSS, USS, the pages no other
process maps, and anonymous memory, from /proc/PID/smaps_rollup). The rows go to `--json`
(from which `--from` draws the figure again without running anything).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scale import (  # benchmarks/ is not a package: run from it, as a script
    PssReads,
    _descendants,
    _rss_bytes,
)

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "scale.toml"
SAMPLE_EVERY_S = 0.2
STOP_GRACE_S = 10.0


def stop(pids: list[int]) -> None:
    """SIGTERM to each of `pids`, then SIGKILL to those still there after STOP_GRACE_S."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.2)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _rollup(pid: int) -> dict[str, int]:
    """PSS, USS (private pages) and anonymous memory of `pid` in bytes; {} if it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            kb = {k: int(v.split()[0]) for k, _, v in (line.partition(":") for line in fh) if v.strip().endswith("kB")}
    except OSError:
        return {}
    return {"pss": kb.get("Pss", 0) * 1024, "uss": (kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0)) * 1024,
            "anon": kb.get("Anonymous", 0) * 1024}


def _roles(launcher: int, run: Path) -> dict[int, str]:
    """pid -> what it is: the launcher, a worker (a process RUN/pids.json names) or the forking parent."""
    try:
        workers = sorted(set(json.loads((run / "pids.json").read_text()).values()))
    except (OSError, ValueError):
        workers = []
    return {launcher: "launcher", **{pid: f"worker-{i}" for i, pid in enumerate(workers)}}


def progress(run: Path) -> dict[str, int]:
    """How far a run got: nodes that recorded a round, and the rounds recorded over all nodes."""
    files = list((run / "nodes").glob("*.rounds.jsonl"))
    rounds = [f.read_text().count("\n") for f in files]
    return {"nodes_in_a_round": sum(1 for r in rounds if r), "rounds_recorded": sum(rounds)}


def measure(nodes: int, overrides: list[str], limit_bytes: int, keep: Path | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run" if keep is None else keep / f"nodes-{nodes}"
        command = [sys.executable, "-m", "p2pfl", "run", str(SCENARIO), "--out", str(run), "--no-progress",
                   "--set", f"nodes={nodes}", "--set", 'runtime.topology="regular:4"',
                   *(arg for o in overrides for arg in ("--set", o))]
        launched = time.time()
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        stopped_at, at_peak = None, []
        pss_reads = PssReads()
        while process.poll() is None:
            pids = [process.pid, *_descendants(process.pid)]
            total = sum(_rss_bytes(p) for p in pids)
            if pss_reads.due(total, time.monotonic()):
                rollups = {p: _rollup(p) for p in pids}
                if pss_reads.read(sum(r.get("pss", 0) for r in rollups.values()), total):
                    roles = _roles(process.pid, run)
                    at_peak = [{"process": roles.get(p, "forking parent"), **{k: v / 1e6 for k, v in r.items()}}
                               for p, r in rollups.items() if r]
            if total > limit_bytes:
                stopped_at = total
                stop(pids)
                break
            time.sleep(SAMPLE_EVERY_S)
        _, err = process.communicate()
        row: dict[str, Any] = {"nodes": nodes, "peak_gb": pss_reads.peak_rss / 1e9, "peak_pss_gb": pss_reads.peak_pss / 1e9,
                               "pss_read_at_rss_gb": pss_reads.rss_at / 1e9, "wall_s": time.time() - launched,
                               "at_peak": at_peak}
        if stopped_at is not None:
            row.update(stopped=f"stopped at {stopped_at / 1e9:.1f} GB, over the limit of {limit_bytes / 1e9:g} GB",
                       **progress(run))
            return row
        if not (run / "results.json").is_file():  # refused before it started, or died: the row says why
            row.update(failed=f"ended with status {process.returncode} and no results: {err.strip()[-300:]}",
                       **progress(run))
            return row
        results = json.loads((run / "results.json").read_text())
    done = [n for n in results["nodes"] if n["rounds"]]
    starts = sorted(n["rounds"][0]["started_at"] - launched for n in done)
    row.update(
        startup_s=starts[-1],
        # When the nodes began round 1 (the first, the median) and when the last one had finished it.
        first_began_s=starts[0], median_began_s=starts[len(starts) // 2],
        first_round_s=max(n["rounds"][0]["started_at"] + n["rounds"][0]["wall_s"] for n in done) - launched,
        round_s=max(statistics.fmean(r["wall_s"] for r in n["rounds"]) for n in done),
        nodes_ok=sum(1 for n in results["nodes"] if n["status"] == "ok"),
        mib_per_node=pss_reads.peak_rss / nodes / 2**20,
    )
    return row


def figure(rows: list[dict[str, Any]], limit_gb: float, path: Path) -> Path:
    from p2pfl.report.style import plt, save_figure

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    finished = [r for r in rows if "stopped" not in r and "failed" not in r]
    stopped = [r for r in rows if "stopped" in r]
    for ax, key, label in zip(axes, ("peak_gb", "startup_s", "round_s"),
                              ("peak memory, all processes (GB)", "start-up (s)", "s per round (slowest node)")):
        ax.plot([r["nodes"] for r in finished], [r[key] for r in finished], marker="o", label="ran to the end")
        if key == "peak_gb":
            ax.axhline(limit_gb, color="#d62728", linestyle="--", linewidth=1, label=f"stopped above {limit_gb:g} GB")
            if stopped:
                ax.plot([r["nodes"] for r in stopped], [r[key] for r in stopped], "x", color="#d62728",
                        markersize=10, label="stopped (over the limit)")
            ax.legend(fontsize=7)
        ax.set_xlabel("nodes (shared placement, regular:4, CNN, FedAvg)")
        ax.set_title(label, fontsize=9)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    settings = sorted({o for r in rows for o in r.get("set", [])})
    fig.suptitle(f"scenarios/scale.toml, 2 rounds, {' '.join(settings) or 'as written'}; one machine", fontsize=9)
    return save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default="1000,3000,5000,10000")
    parser.add_argument("--limit-gb", type=float, default=21.0, help="stop a run whose processes hold more")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--from", dest="source", type=Path, help="draw the figure from rows written before")
    parser.add_argument("--figure", type=Path, help="a PNG of the three curves")
    parser.add_argument("--out", type=Path, help="keep each run's folder here, as nodes-N (else removed), to look "
                                                 "into or check again (benchmarks/churn_scale.py --check)")
    args = parser.parse_args()
    if args.source is not None:
        saved = json.loads(args.source.read_text())
        rows, limit_gb = saved["rows"], saved["limit_gb"]
    else:
        rows, limit_gb = [], args.limit_gb
        for n in (int(x) for x in args.nodes.split(",")):
            rows.append({**measure(n, args.overrides, int(args.limit_gb * 1e9), args.out), "set": args.overrides})
            print(json.dumps(rows[-1]), flush=True)
            if args.json is not None:  # after each size: a later one may take long, or be stopped
                args.json.write_text(json.dumps({"limit_gb": limit_gb, "cores": os.cpu_count(), "rows": rows},
                                                indent=1) + "\n")
    print(f"{'nodes':>6}{'start-up s':>12}{'round 1 by s':>14}{'s / round':>11}{'peak GB':>9}{'MiB / node':>12}"
          f"{'ok':>7}")
    for r in rows:
        if "stopped" in r or "failed" in r:
            print(f"{r['nodes']:>6}  {r.get('stopped') or r['failed']}; {r['nodes_in_a_round']} nodes had recorded a "
                  f"round, {r['rounds_recorded']} rounds in all")
        else:
            first = f"{r['first_round_s']:.1f}" if "first_round_s" in r else "-"  # rows written before it was kept
            print(f"{r['nodes']:>6}{r['startup_s']:>12.1f}{first:>14}{r['round_s']:>11.1f}{r['peak_gb']:>9.2f}"
                  f"{r['mib_per_node']:>12.2f}{r['nodes_ok']:>7}")
        for share in r.get("at_peak", []):  # rows written before it was kept have none
            print(f"{'':>6}  at the PSS peak, {share['process']}: PSS {share['pss']:.0f} MB, USS {share['uss']:.0f} MB, "
                  f"anonymous {share['anon']:.0f} MB")
    if args.figure is not None:
        print(f"figure: {figure(rows, limit_gb, args.figure)}")


if __name__ == "__main__":
    main()
