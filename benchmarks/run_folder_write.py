"""Writing a many-node run folder (keys, roster, one config per node): the launcher does it
before any node is built, so at 10,000 nodes it is seconds of the run's start-up.

    python benchmarks/run_folder_write.py [--nodes 10000] [--pairs 3]

Alternates, in this process, `write_run_folder` as it is (the keys written beside the configs,
without a flush each, then flushed together with one `syncfs`; the configs' folder resolved
once) with the way before (each key made as a temporary file, flushed and renamed, 32 at a
time, and then the configs, each resolving its folder), on `scenarios/scale.toml --set nodes=N`,
each into a fresh folder that is then removed. Printed: each write's seconds and the median of
the pairs' ratios, then the launcher's other work before a worker builds: placement's graph
bisection (regular:4). Making a file on an ext4 file system without a journal (this project's
machines) costs more for a minute or more after many files were removed (it looks past inodes
freed recently): a run that follows another's cleanup pays for it, and so does every write here
after the first pair. Read the pairs, not one number.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from p2pfl.runtime.config import NodeConfig, node_ids
from p2pfl.runtime.run_folder import RunFolder
from p2pfl.runtime.topology import Topology
from p2pfl.scenario import launcher
from p2pfl.scenario.schema import load_scenario
from p2pfl.wire import keys as keys_module

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "scale.toml"


@contextmanager
def the_way_before() -> Iterator[None]:
    """Each key flushed on its own (the pool), each config resolving its own folder."""
    available, save = keys_module._syncfs_available, NodeConfig.save
    keys_module._syncfs_available = lambda: False
    NodeConfig.save = lambda self, path, resolved_folder=None: save(self, path)  # type: ignore[method-assign]
    try:
        yield
    finally:
        keys_module._syncfs_available, NodeConfig.save = available, save  # type: ignore[method-assign]


def write_the_way_before(scenario: Any, out: Path) -> None:
    """The run folder as `write_run_folder` wrote it before: keys first, then the configs."""
    out = out.resolve()
    folder = RunFolder(out)
    folder.create()
    folder.scenario.write_text(json.dumps(scenario.to_dict(), indent=2))
    ids = node_ids(scenario.nodes)
    keys = {i: keys_module.NodeKey.generate() for i in ids}
    with the_way_before():
        keys_module.NodeKey.save_all({folder.key(i): key for i, key in keys.items()})
        launcher._write_configs(scenario, folder, out, ids, keys, None)


def timed_write(scenario: Any, out: Path, before: bool, settle: float) -> float:
    start = time.perf_counter()
    if before:
        write_the_way_before(scenario, out)
    else:
        launcher.write_run_folder(scenario, out)
    spent = time.perf_counter() - start
    shutil.rmtree(out)
    time.sleep(settle)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--settle", type=float, default=0.0,
                        help="seconds to wait after each removal (ext4 without a journal: 60-300 for a clean start)")
    args = parser.parse_args()
    scenario = load_scenario(SCENARIO, [f"nodes={args.nodes}"])
    ratios = []
    with tempfile.TemporaryDirectory(prefix="run_folder_write_") as tmp:
        for pair in range(args.pairs):
            seconds = {}
            for way in (("before", "now") if pair % 2 == 0 else ("now", "before")):
                seconds[way] = timed_write(scenario, Path(tmp) / f"{way}-{pair}", before=way == "before", settle=args.settle)
            ratios.append(seconds["now"] / seconds["before"])
            print(f"pair {pair + 1}: before {seconds['before']:.2f} s, now {seconds['now']:.2f} s; "
                  f"now / before {ratios[-1]:.2f}", flush=True)
    print(f"{args.nodes} nodes: median now / before {statistics.median(ratios):.2f} over {args.pairs} pairs")
    start = time.perf_counter()  # the launcher's other work before a worker builds: placement's order
    Topology.parse("regular:4").locality_order(args.nodes, scenario.seed)
    print(f"placement's graph bisection (regular:4, shared placement's locality order): {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
