"""How many nodes one machine holds: wall per round, start-up and peak memory by placement.

    python benchmarks/scale.py [SCENARIO] [--nodes 10,30,100] [--process 10]
        [--algorithms fedavg,pfedsv] [--topologies full,regular:4] [--set key=value ...]

For each algorithm, topology and N the scenario runs with `nodes = N` in `shared` placement
(nodes as asyncio tasks in one worker process per core), and for the `--process` sizes (first
algorithm, first topology) also with one OS process per node, side by side. pFedSV runs with
k = 5 downloads per round. Printed per run: start-up (launch to the moment the last node began
round 1), wall per round (the slowest node's mean round `wall_s`), the whole launcher wall,
the peak RSS summed over every process of the run (this script's children, sampled
from /proc every 0.2 s), bytes a round, and the compute fraction (train + evaluate + aggregate
over the rounds' wall, `p2pfl.runtime.timing`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from p2pfl.scenario.launcher import run_loaded
from p2pfl.scenario.schema import load_scenario


def _descendants(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    parents[int(entry)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        children = [p for p, parent in parents.items() if parent == pid]
        out += children
        frontier += children
    return out


def _proc_bytes(pid: int, file: str, field: str) -> int:
    """A size in kB from /proc/PID/FILE's line that starts with FIELD, in bytes; 0 if gone."""
    try:
        with open(f"/proc/{pid}/{file}") as fh:
            for line in fh:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _rss_bytes(pid: int) -> int:
    return _proc_bytes(pid, "status", "VmRSS:")


def _pss_bytes(pid: int) -> int:
    """The process's proportional set size: each page it shares counted once over its sharers (a
    forked worker shares its parent's imports: summed RSS counts them once a process)."""
    return _proc_bytes(pid, "smaps_rollup", "Pss:")


class PssReads:
    """When to read the processes' PSS, and the highest read: only near the highest summed RSS
    seen so far, and at most every `every_s` seconds.

    RSS is a counter the kernel keeps (/proc/PID/status, 0.03 ms). PSS is not: smaps_rollup walks
    every page a process maps, 0.1 s of CPU for a worker of 7 GB, holding its memory map's lock.
    Read every 0.2 s beside a 10,000-node run on two cores, that was about 40 % of one core: the
    run's system time was 155-186 s, against 98-112 s read this way (docs/benchmarks.md, issue 66).
    Shared pages (the forking parent's imports) change little during a run, so PSS peaks where RSS
    does; the RSS at the read that gave the PSS peak is kept (`rss_at`) to show how near it was."""

    def __init__(self, near: float = 0.98, every_s: float = 2.0) -> None:
        self.near, self.every_s = near, every_s
        self.peak_rss = self.peak_pss = 0
        self.rss_at = 0  # the summed RSS when the highest PSS was read
        self.last = float("-inf")

    def due(self, rss: int, now: float) -> bool:
        """Whether to read PSS now, the processes holding `rss` bytes at time `now` (seconds)."""
        self.peak_rss = max(self.peak_rss, rss)
        if rss >= self.near * self.peak_rss and now - self.last >= self.every_s:
            self.last = now
            return True
        return False

    def read(self, pss: int, rss: int) -> bool:
        """A PSS read at summed RSS `rss`; True when it is the highest so far."""
        if pss <= self.peak_pss:
            return False
        self.peak_pss, self.rss_at = pss, rss
        return True


class PeakMemory:
    """Samples the summed RSS of this process's descendants until stopped (`peak`), and their
    summed PSS (`peak_pss`: what they take from the machine, shared pages counted once) when
    `PssReads` says so."""

    def __init__(self, every_s: float = 0.2) -> None:
        self.every_s = every_s
        self.pss_reads = PssReads()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            pids = _descendants(os.getpid())
            rss = sum(_rss_bytes(p) for p in pids)
            if self.pss_reads.due(rss, time.monotonic()):
                self.pss_reads.read(sum(_pss_bytes(p) for p in pids), rss)
            self._stop.wait(self.every_s)

    @property
    def peak(self) -> int:
        return self.pss_reads.peak_rss

    @property
    def peak_pss(self) -> int:
        return self.pss_reads.peak_pss

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


PFEDSV_K = 5


def measure(path: str, overrides: list[str], nodes: int, placement: str, algorithm: str,
            topology: str) -> dict[str, float]:
    extra = [f'algorithm.name="{algorithm}"', f'runtime.topology="{topology}"']
    if algorithm == "pfedsv":
        extra.append(f"algorithm.params.k={PFEDSV_K}")
    scenario = load_scenario(path, [*overrides, *extra, f"nodes={nodes}", f'runtime.placement="{placement}"'])
    with tempfile.TemporaryDirectory() as tmp, PeakMemory() as memory:
        launched = time.time()
        results, code = run_loaded(scenario, Path(tmp) / "run", progress=False, quiet=True)
    if code != 0:
        raise SystemExit(f"{algorithm} {topology} {placement} with {nodes} nodes failed: "
                         f"{results['summary']['nodes_failed'][:5]}")
    first = [n["rounds"][0]["started_at"] for n in results["nodes"]]
    per_round = max(statistics.fmean(r["wall_s"] for r in n["rounds"]) for n in results["nodes"])
    return {"startup_s": max(first) - launched, "round_s": per_round, "wall_s": results["summary"]["wall_s"],
            "peak_gb": memory.peak / 1e9, "acc": results["summary"]["mean_acc"],
            "gb_per_round": results["summary"]["total_bytes"] / scenario.rounds / 1e9,
            "compute": results["summary"].get("compute_fraction") or float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", nargs="?", default="scenarios/scale.toml")
    parser.add_argument("--nodes", default="10,30,100", help="comma-separated sizes for the shared placement")
    parser.add_argument("--process", default="10", help="sizes also run with one process per node ('' for none)")
    parser.add_argument("--algorithms", default="fedavg,pfedsv")
    parser.add_argument("--topologies", default="full,regular:4")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    topologies = [t.strip() for t in args.topologies.split(",") if t.strip()]
    runs = [(algorithms[0], topologies[0], "process", int(n)) for n in args.process.split(",") if n.strip()]
    runs += [(a, t, "shared", int(n)) for a in algorithms for t in topologies for n in args.nodes.split(",") if n.strip()]
    base = load_scenario(args.scenario, args.overrides)
    print(f"{base.name}: {base.model.name}, {base.rounds} rounds, {os.cpu_count()} cores; "
          f"workers per shared run: {base.runtime.workers or os.cpu_count()}; pfedsv k = {PFEDSV_K}")
    print(f"{'algorithm':<10}{'topology':<11}{'placement':<10}{'nodes':>6}{'start-up s':>12}{'s / round':>11}"
          f"{'wall s':>9}{'peak RSS GB':>13}{'GB / round':>12}{'compute':>9}{'acc':>7}")
    for algorithm, topology, placement, n in runs:
        m = measure(args.scenario, args.overrides, n, placement, algorithm, topology)
        print(f"{algorithm:<10}{topology:<11}{placement:<10}{n:>6}{m['startup_s']:>12.1f}{m['round_s']:>11.1f}"
              f"{m['wall_s']:>9.1f}{m['peak_gb']:>13.2f}{m['gb_per_round']:>12.2f}{m['compute']:>9.2f}{m['acc']:>7.3f}",
              flush=True)


if __name__ == "__main__":
    main()
