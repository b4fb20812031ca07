"""What a worker's memory is at each periodic trim: its RSS before and after, and what glibc's
malloc holds in use (`mallinfo2`), so that freed blocks, live blocks and memory outside malloc's
heap (Python's small-object arenas, a table per node) can be told apart (issue 66).

    python benchmarks/heap_log.py --log DIR -- python benchmarks/memory_curve.py --nodes 10000 ...
    python benchmarks/heap_log.py --summary DIR

Runs the command with every Python process below it logging, at each of its trims
(`p2pfl.runtime.resources.release_freed_memory`, every 0.25 s in a worker of many nodes), one line
to DIR/heap.<pid>: time, RSS before the trim, RSS after it, malloc's arena bytes, its mmapped
bytes, its bytes in use and free. `--summary` prints, per process, the line of the highest RSS
and the longest gap between two trims. Linux and glibc only.
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# Loaded by every Python process of the run (PYTHONPATH): wraps the trim with the log line.
SITECUSTOMIZE = r'''
import ctypes, ctypes.util, os, time
log_dir = os.environ.get("P2PFL_HEAP_LOG_DIR")
if log_dir:
    import p2pfl.runtime.resources as resources

    class _Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                    "fsmblks", "uordblks", "fordblks", "keepcost")]

    _info = ctypes.CDLL(ctypes.util.find_library("c")).mallinfo2
    _info.restype = _Info
    _trim = resources.release_freed_memory

    def _rss():
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) * 1024

    def release_freed_memory():
        info, before = _info(), _rss()
        done = _trim()
        with open(os.path.join(log_dir, f"heap.{os.getpid()}"), "a") as out:
            out.write(f"{time.time():.2f} {before} {_rss()} {info.arena} {info.hblkhd} {info.uordblks} {info.fordblks}\n")
        return done

    resources.release_freed_memory = release_freed_memory
'''


def summary(log_dir: Path) -> None:
    gib = 2**30
    for path in sorted(log_dir.glob("heap.*")):
        rows = [[float(x) for x in line.split()] for line in path.read_text().splitlines() if line.strip()]
        if not rows:
            continue
        top = max(rows, key=lambda r: r[1])
        gap = max((b[0] - a[0] for a, b in itertools.pairwise(rows)), default=0.0)
        print(f"{path.name}: {len(rows)} trims; highest RSS {top[1] / gib:.2f} GiB (after its trim {top[2] / gib:.2f}, "
              f"malloc in use {top[5] / gib:.2f}, outside malloc's heap {(top[2] - top[5]) / gib:.2f}); "
              f"longest gap between trims {gap:.1f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", type=Path, help="the folder for the log lines")
    parser.add_argument("--summary", type=Path, help="summarise a folder written before")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args()
    if args.summary is not None:
        summary(args.summary)
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.log is None or not command:
        parser.error("give --log DIR -- COMMAND, or --summary DIR")
    args.log.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as site:
        Path(site, "sitecustomize.py").write_text(SITECUSTOMIZE)
        env = {**os.environ, "P2PFL_HEAP_LOG_DIR": str(args.log.resolve()),
               "PYTHONPATH": os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH")) if p)}
        code = subprocess.call(command, env=env)
    summary(args.log)
    return code


if __name__ == "__main__":
    sys.exit(main())
