"""What a worker spends before its nodes can start: each node's data slice, ground truth and
neighbours, computed per node from scratch (the old way) and through the worker's caches.

    python benchmarks/startup.py [--nodes 1000] [--share 500] [--set key=value ...]

`--share` nodes of a `--nodes`-node run on `scenarios/scale.toml` with a `regular:4` graph, as one
of two workers builds them. Printed: seconds for the share from scratch (the partition's
assignment, every node's ground truth and the graph redone for each node, as before) and with
the caches (`p2pfl.data.partition._assignment`, `p2pfl.runtime.topology._neighbour_rows`), and
their ratio.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from p2pfl.data import build_partition
from p2pfl.data.partition import _assignment
from p2pfl.runtime import topology
from p2pfl.scenario.schema import load_scenario

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "scale.toml"


def share_seconds(sc, share: range, cached: bool) -> float:
    graph = topology.Topology.parse(sc.runtime.topology)
    _assignment.cache_clear()
    topology._neighbour_rows.cache_clear()
    began = time.perf_counter()
    for i in share:
        if not cached:  # every node did the whole run's work itself
            _assignment.cache_clear()
            topology._neighbour_rows.cache_clear()
        build_partition(sc.data, sc.nodes, sc.seed, only=[i])
        graph.neighbours_of(i, sc.nodes, sc.seed)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--share", type=int, default=500, help="nodes one worker builds")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    sc = load_scenario(SCENARIO, [*args.overrides, f"nodes={args.nodes}", 'runtime.topology="regular:4"'])
    share = range(0, min(args.nodes, 2 * args.share), 2)  # worker 0 of 2: every other node
    build_partition(sc.data, sc.nodes, sc.seed, only=[0])  # the data pool, read once either way
    cached = share_seconds(sc, share, cached=True)
    # From scratch on a tenth of the share (it is linear in the share), scaled up.
    sample = range(share.start, share.start + share.step * max(1, len(share) // 10), share.step)
    scratch = share_seconds(sc, sample, cached=False) * len(share) / len(sample)
    print(f"{args.nodes} nodes, {len(share)} built by one worker: from scratch {scratch:.1f} s "
          f"(estimated from {len(sample)} nodes), with the worker's caches {cached:.2f} s, {scratch / cached:.0f}x")


if __name__ == "__main__":
    main()
