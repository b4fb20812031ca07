"""Build time of every digits domain from a clean cache, and the cached load time.

    python benchmarks/data_build.py [--repeat N] [--keep DIR]

Points ``P2PFL_DATA_CACHE`` at a fresh temporary folder (your own cache is not touched),
builds the domains in the order mnist, uci, usps, mnistm, synth (usps and mnistm are
derived from the cached mnist, so their times exclude building mnist), then loads each
domain again from the cache (best of ``--repeat``). Prints samples, shape, .npz size,
build seconds, cached-load seconds and build/load ratio per domain.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

ORDER = ("mnist", "uci", "usps", "mnistm", "synth")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="cached loads per domain (best is reported)")
    ap.add_argument("--keep", type=Path, default=None, help="use (and empty) this folder instead of a temporary one")
    args = ap.parse_args()

    folder = args.keep or Path(tempfile.mkdtemp(prefix="p2pfl-data-bench-"))
    os.environ["P2PFL_DATA_CACHE"] = str(folder)

    from p2pfl.data import cache_dir, clear_cache, load_domain
    from p2pfl.data.digits import cache_name

    clear_cache()
    assert cache_dir() == folder and not list(folder.glob("*.npz")), "cache not clean"
    print(f"cache: {folder} (cleared)")
    print(f"{'domain':<8} {'samples':>7} {'shape':<16} {'npz MB':>7} {'build s':>8} {'load s':>8} {'build/load':>10}")
    total_build = 0.0
    try:
        for dom in ORDER:
            t0 = time.perf_counter()
            x, y = load_domain(dom)
            build = time.perf_counter() - t0
            total_build += build
            size = (folder / f"{cache_name(dom)}.npz").stat().st_size / 1e6
            loads = []
            for _ in range(max(1, args.repeat)):
                t0 = time.perf_counter()
                load_domain(dom)
                loads.append(time.perf_counter() - t0)
            load = min(loads)
            print(
                f"{dom:<8} {len(y):>7} {str(tuple(x.shape)):<16} {size:>7.2f} {build:>8.2f} {load:>8.4f} {build / load:>9.0f}x"
            )
        print(f"total build: {total_build:.1f} s")
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
