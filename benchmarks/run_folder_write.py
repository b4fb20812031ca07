"""Writing a many-node run folder (keys, roster, one config per node): the launcher does it
before any node is built, so at 10,000 nodes it is seconds of the run's start-up.

    python benchmarks/run_folder_write.py [--nodes 10000] [--pairs 3]

Alternates, in this process, `write_run_folder` as it is (the keys written without a flush each
and flushed together with one `syncfs`; the configs' folder resolved once) with the way before
(each key flushed on its own, 32 at a time; each config resolving its folder), on
`scenarios/scale.toml --set nodes=N`, each into a fresh folder that is then removed (and the
file system flushed, so that one write's removal does not fall into the next). Printed: each
write's seconds, the keys' and the configs' share, and the median of the pairs' ratios.
File creation on this machine's disk varies by a factor of ten from one minute to the next: read
the pairs, not one number.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from p2pfl.runtime.config import NodeConfig
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


def timed_write(scenario: Any, out: Path) -> dict[str, float]:
    spent = {"keys": 0.0, "configs": 0.0}

    def timing(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += time.perf_counter() - start
        return timed

    save_all, save = keys_module.NodeKey.save_all, NodeConfig.save
    keys_module.NodeKey.save_all = staticmethod(timing("keys", save_all))  # type: ignore[method-assign]
    NodeConfig.save = timing("configs", save)  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        launcher.write_run_folder(scenario, out)
        spent["total"] = time.perf_counter() - start
    finally:
        keys_module.NodeKey.save_all, NodeConfig.save = save_all, save  # type: ignore[method-assign]
    shutil.rmtree(out)
    os.sync()
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    scenario = load_scenario(SCENARIO, [f"nodes={args.nodes}"])
    ratios = []
    with tempfile.TemporaryDirectory(prefix="run_folder_write_") as tmp:
        for pair in range(args.pairs):
            rows = {}
            for way in (("before", "now") if pair % 2 == 0 else ("now", "before")):
                if way == "before":
                    with the_way_before():
                        rows[way] = timed_write(scenario, Path(tmp) / f"{way}-{pair}")
                else:
                    rows[way] = timed_write(scenario, Path(tmp) / f"{way}-{pair}")
            ratios.append(rows["now"]["total"] / rows["before"]["total"])
            print(f"pair {pair + 1}: " + "; ".join(
                f"{way} {r['total']:.2f} s (keys {r['keys']:.2f}, configs {r['configs']:.2f})" for way, r in rows.items())
                + f"; now / before {ratios[-1]:.2f}")
    print(f"{args.nodes} nodes: median now / before {statistics.median(ratios):.2f} over {args.pairs} pairs")


if __name__ == "__main__":
    main()
