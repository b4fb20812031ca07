"""What a node holds, by component: bytes per node after its rounds, in one worker process.

    python benchmarks/node_memory.py [SCENARIO] [--nodes 100] [--set key=value ...]

The scenario's nodes (default `scenarios/scale.toml`, 100 nodes) are built and run in this
process on one event loop, as a `shared` placement's worker runs its share. After the run, each
node's object graph is walked from its attributes (`model`, `trainer`, `data`, `endpoint`,
`strategy`, ...), without crossing into other nodes, the event loop, modules or classes. Tensor,
array and frame (bytes of 1 KiB or more) memory is counted once per storage, under the first attribute that reaches them; a
storage that several nodes reach is counted once, as "shared". Printed per component: tensor
bytes per node (mean) and the share they explain of what one more node adds to the process's RSS
(the second half of the nodes' build, per node, plus the run's growth per node); the rest is
Python objects and allocator overhead ("other").
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from p2pfl.assembly import HEAP_RELEASE_EVERY_S, assemble_node
from p2pfl.hosting.footprint import Reached, walk, walk_from
from p2pfl.runtime.config import load_node_config
from p2pfl.runtime.node import Node
from p2pfl.runtime.resources import (
    host_many_nodes,
    release_freed_memory,
    release_periodically,
)
from p2pfl.scenario.launcher import write_run_folder
from p2pfl.scenario.schema import load_scenario

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "scale.toml"
PEAK_EVERY_S = 0.5


def rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def node_storages(node: Node) -> dict[str, dict[int, int]]:
    """Component (the node attribute first reaching it) -> storage key -> bytes."""
    found: dict[str, dict[int, int]] = defaultdict(dict)
    for key, (component, nbytes) in walk(node).storages.items():
        found[component][key] = nbytes
    return found


# What `--peak` names separately, walked in this order (a storage counts under the first that reaches it).
PEAK_ROOTS: tuple[tuple[str, Callable[[Node], Any]], ...] = (
    ("model", lambda n: n.parts.model),
    ("data", lambda n: n.parts.data),
    ("carrier (published parts)", lambda n: n.parts.transport),
    ("strategy (FedAvg's running sum)", lambda n: n.parts.strategy),
    ("round checks (the round's start copy)", lambda n: n.exchange.intake),
)


def held_now(nodes: list[Node]) -> dict[str, int]:
    """Component -> tensor, array and frame bytes the nodes' attributes reach at this moment, each
    storage once (a co-located carrier reaches its neighbours' published parts too); then what
    only the locals of the running coroutines and threads reach, by the function holding it
    (arrivals being decoded, a fit's batches)."""
    reached, seen = Reached({}, {}), set()
    for node in nodes:
        own = {id(node), id(node.__dict__)}
        walk_from([*((name, get(node)) for name, get in PEAK_ROOTS), *vars(node).items()], reached, own, node)
        seen |= own
    walk_from(list(frame_roots()), reached, seen)
    total: dict[str, int] = defaultdict(int)
    for component, nbytes in reached.storages.values():
        total[component] += nbytes
    return dict(total)


def frame_roots() -> Iterator[tuple[str, Any]]:
    """(a function's name, its locals) for every frame of every task of this event loop and every
    thread of this process, innermost first."""
    for task in asyncio.all_tasks():
        for frame in reversed(task.get_stack()):
            yield f"locals of {frame.f_code.co_qualname} (task)", dict(frame.f_locals)
    for frame in sys._current_frames().values():
        while frame is not None:
            yield f"locals of {frame.f_code.co_qualname} (thread)", dict(frame.f_locals)
            frame = frame.f_back


async def sample_peak(nodes: list[Node], every_s: float, peak: dict[str, Any], walk_too: bool = True) -> None:
    """Every `every_s`, what the nodes hold (`held_now`, unless not `walk_too`) and the RSS; keeps
    the sample of the largest RSS, and the RSS right after a trim at that sample."""
    while True:
        await asyncio.sleep(every_s)
        rss, held = rss_bytes(), held_now(nodes) if walk_too else {}
        if rss > peak.get("rss", 0):
            release_freed_memory()  # what of it was freed blocks the heap had not handed back yet
            peak.update(rss=rss, trimmed=rss_bytes(), held=held, rounds=[n.round for n in nodes])


async def _run(nodes: list[Node], workers: int, peak: dict[str, Any] | None = None,
               walk_too: bool = True) -> list[dict[str, Any]]:
    # As a worker runs its share (p2pfl.assembly.host_nodes): its thread pool and heap settings, and
    # freed heap pages going back as it goes. Without `host_many_nodes` (before 2026-11-28), asyncio's
    # default pool of cores + 4 threads each kept a heap of its own: "other" read 2.6 MiB a node.
    host_many_nodes(asyncio.get_running_loop(), workers)
    trimming = asyncio.ensure_future(release_periodically(HEAP_RELEASE_EVERY_S))
    sampling = asyncio.ensure_future(sample_peak(nodes, PEAK_EVERY_S, peak, walk_too)) if peak is not None else None
    try:
        return list(await asyncio.gather(*(n.run() for n in nodes)))
    finally:
        trimming.cancel()
        if sampling is not None:
            sampling.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", nargs="?", default=str(SCENARIO))
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--peak", action="store_true",
                        help=f"also walk the nodes every {PEAK_EVERY_S} s of the run and print what they held at the "
                             "sample of the largest RSS")
    parser.add_argument("--no-walk", action="store_true",
                        help="with --peak, sample only the RSS and the RSS after a trim (the walks of 1000 nodes "
                             "outlast the run)")
    args = parser.parse_args()
    scenario = load_scenario(args.scenario, [*args.overrides, f"nodes={args.nodes}", 'runtime.placement="shared"'])
    torch.set_num_threads(scenario.runtime.torch_threads)
    logging.getLogger("p2pfl").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        paths, coordinator = write_run_folder(scenario, Path(tmp) / "run")
        if coordinator is not None:
            raise SystemExit("this benchmark runs nodes only: pick an algorithm without a coordinator")
        before = rss_bytes()
        half = len(paths) // 2
        nodes = [assemble_node(load_node_config(p), scenario) for p in paths[:half]]
        built_half = rss_bytes()  # past the one-off costs (the data set read, imports, first allocations)
        nodes += [assemble_node(load_node_config(p), scenario) for p in paths[half:]]
        built = rss_bytes()
        peak: dict[str, Any] | None = {} if args.peak else None
        results = asyncio.run(_run(nodes, scenario.runtime.workers, peak, not args.no_walk))
        release_freed_memory()  # what the nodes hold, not garbage waiting for the next second's trim
        after = rss_bytes()
    failed = [r.get("status") for r in results if r.get("status") != "ok"]
    per_node = [node_storages(n) for n in nodes]
    owners: dict[int, int] = defaultdict(int)
    for storages in per_node:
        for by_key in storages.values():
            for key in by_key:
                owners[key] += 1
    components = sorted({c for s in per_node for c in s})
    n = len(nodes)
    rows = []
    shared: dict[int, int] = {}
    for component in components:
        own = [sum(b for k, b in s.get(component, {}).items() if owners[k] == 1) for s in per_node]
        for s in per_node:
            shared.update({k: b for k, b in s.get(component, {}).items() if owners[k] > 1})
        if any(own):
            rows.append((component, statistics.fmean(own)))
    # What one more node costs: its share of the second half's build, and of the run's growth.
    growth = (built - built_half) / max(1, n - half) + (after - built) / n
    print(f"{scenario.name}: {n} nodes, {scenario.model.name}, {scenario.algorithm.name}, {scenario.rounds} rounds, "
          f"topology {scenario.runtime.topology}; nodes not ok: {len(failed)}")
    print(f"process RSS: {before / 2**20:.0f} MiB before, {built / 2**20:.0f} MiB built, {after / 2**20:.0f} MiB "
          f"after the run: {(built - built_half) / max(1, n - half) / 2**10:.0f} KiB per node built (the second half's), "
          f"{(after - built) / n / 2**10:.0f} KiB per node more after the run; {growth / 2**10:.0f} KiB per node in all")
    print(f"{'component':<22}{'KiB per node':>14}{'share of growth':>17}")
    for component, nbytes in sorted(rows, key=lambda r: -r[1]):
        print(f"{component:<22}{nbytes / 2**10:>14.1f}{nbytes / growth:>16.0%}")
    tensors = sum(b for _, b in rows)
    print(f"{'shared by nodes':<22}{sum(shared.values()) / n / 2**10:>14.1f}{sum(shared.values()) / n / growth:>16.0%}"
          f"   ({sum(shared.values()) / 2**20:.1f} MiB once for all)")
    print(f"{'other (objects)':<22}{(growth - tensors) / 2**10:>14.1f}{(growth - tensors) / growth:>16.0%}")
    if peak:
        rounds = sorted(set(peak["rounds"]))
        print(f"\nat the sample of the largest RSS ({peak['rss'] / 2**20:.0f} MiB; {(peak['rss'] - built) / n / 2**10:.0f} "
              f"KiB per node over the built nodes; nodes in rounds {rounds}): what their attributes reach, per node")
        print(f"freed blocks not yet handed back: {(peak['rss'] - peak['trimmed']) / n / 2**10:.0f} KiB per node "
              f"(the RSS right after a trim at that sample: {peak['trimmed'] / 2**20:.0f} MiB)")
        for component, nbytes in sorted(peak["held"].items(), key=lambda kv: -kv[1]):
            print(f"{component:<40}{nbytes / n / 2**10:>10.1f} KiB")


if __name__ == "__main__":
    main()
