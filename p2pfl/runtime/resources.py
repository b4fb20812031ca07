"""What a process hosting many nodes asks of the operating system: its freed memory handed back
while the nodes run, and room for a socket per neighbour.

Memory:

glibc keeps freed blocks for reuse, and after the first large block is freed it serves blocks
of a model's size (hundreds of KB) from its heaps instead of fresh mappings. A worker whose
nodes each copy, encode and receive several such blocks a round then holds the high-water
mark of every round's garbage: at 1000 nodes, about 2 MiB a node that nothing uses
(`python benchmarks/node_memory.py`). `malloc_trim` returns those pages every
`p2pfl.assembly.HEAP_RELEASE_EVERY_S`; between two trims, freed blocks stay in the heap for the
next ones (`keep_freed_blocks`) instead of being unmapped and mapped again page by page. Elsewhere than on glibc this does nothing.

The interpreter: at its default thresholds Python's cycle collector ran every 700 allocations
and, every so often, walked every object of every node in the process (6 % of a 1000-node
worker's CPU under `perf`); a worker of many nodes collects its young objects every 100,000
allocations instead. And asyncio's default pool (cores + 4 threads) had six threads in each of
two workers on two cores contending for one interpreter lock per worker, the kernel switching
between them (a third of the CPU was system time); a worker's pool has its share of the cores
in threads, one on a machine with as many workers as cores: a second thread there only shared
the worker's core and interpreter lock with the first and the event loop, and held a second
node's training garbage at once (at 10,000 nodes on two cores, round 1 ended 13-35 s sooner
with one on one machine and 110-125 s sooner on one half as fast, 2-2.5 GB lower on both;
docs/benchmarks.md, issue 66).

Files: every node holds a listening socket and a connection per neighbour it reads or serves;
500 nodes of a 20-regular graph in one process need over 20,000. `raise_open_file_limit`
lifts the soft limit to the hard one, as servers do at start; past the hard limit, nodes fail
with `Too many open files`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import ctypes.util
import functools
import gc
import os
import threading
from collections.abc import Callable

from p2pfl.runtime.worker_pool import use_training_last_pool

MANY_NODES_GC_THRESHOLDS = (100_000, 50, 1000)


@functools.cache
def _glibc(function: str) -> Callable[..., int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return getattr(ctypes.CDLL(name), function)  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to tune
        return None


def _malloc_trim() -> Callable[[int], int] | None:
    return _glibc("malloc_trim")


# mallopt's parameters (glibc's malloc.h) and the values a worker of many nodes sets.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MANY_NODES_MMAP_THRESHOLD = 32 * 2**20  # glibc's largest on 64-bit systems
MANY_NODES_TRIM_THRESHOLD = 2**30


def keep_freed_blocks() -> bool:
    """Serve blocks up to 32 MiB from the heap and keep freed ones there until the next
    `release_freed_memory`; False where the C library has no mallopt.

    By default glibc maps each block larger than its moving threshold afresh and unmaps it when
    freed, and the kernel zeroes every page of the next one on first touch: a worker's nodes copy,
    widen and train on blocks of a model's size, a little larger or smaller each time, and such
    page faults were the largest share of a 1000-node run's system time (`perf record -a`).
    `release_periodically` still hands the freed pages back as the worker runs."""
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MANY_NODES_MMAP_THRESHOLD)) and \
        bool(mallopt(_M_TRIM_THRESHOLD, MANY_NODES_TRIM_THRESHOLD))


def release_freed_memory() -> bool:
    """Give the heap's free pages back to the OS; False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


_TRIM_PENDING: set[asyncio.AbstractEventLoop] = set()


@functools.cache
def _trimmer() -> concurrent.futures.ThreadPoolExecutor:
    """A thread for `release_soon`'s trims. Not the loop's default pool: a worker's thousands of
    nodes queue their training there at once (5000 at 10,000 nodes, over a minute of work), and a
    trim queued behind them came after the garbage had piled up."""
    return concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="p2pfl-trim")


def release_soon(delay_s: float = 0.5) -> None:
    """`release_freed_memory` once, `delay_s` from now and off the event loop, however many ask
    meanwhile: after the node dropped large buffers (a stalled reader's unsent answer) that the
    C library would otherwise keep in the heap. A node process of its own has no periodic release:
    three waves of 16 aborted reads of a 13 MB model left it 267 MiB larger."""
    loop = asyncio.get_running_loop()
    if loop in _TRIM_PENDING or _malloc_trim() is None:
        return
    _TRIM_PENDING.add(loop)

    def run() -> None:
        _TRIM_PENDING.discard(loop)
        loop.run_in_executor(_trimmer(), release_freed_memory)

    loop.call_later(delay_s, run)


async def release_periodically(every_s: float) -> None:
    """`release_freed_memory` every `every_s` seconds on a thread of its own, until cancelled.

    Timed by that thread, not by the event loop: at 10,000 nodes a worker's loop, busy with its
    5000 nodes' arrivals, woke a quarter-second sleep up to 24 s late, and by then its heap held
    up to 3.7 GiB of freed blocks that one trim handed back (docs/benchmarks.md, issue 66)."""
    if _malloc_trim() is None:
        return
    stop = threading.Event()

    def trim_until_stopped() -> None:
        while not stop.wait(every_s):
            release_freed_memory()

    thread = threading.Thread(target=trim_until_stopped, name="p2pfl-trim", daemon=True)
    thread.start()
    try:
        await asyncio.Event().wait()  # until cancelled
    finally:
        stop.set()
        thread.join()  # at most one trim still running: milliseconds


def raise_open_file_limit() -> int | None:
    """The soft limit on open files raised to the hard one; the new soft limit (None where the
    platform has no such limit)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def host_many_nodes(loop: asyncio.AbstractEventLoop, workers: int) -> int:
    """Settle this process to host many nodes as one of `workers` processes on this machine (0:
    one per core): fewer cycle collections, freed blocks kept for reuse (`keep_freed_blocks`),
    and a pool of its share of the cores for the nodes' training, which takes any other work first
    (`p2pfl.runtime.worker_pool`). Returns the pool's thread count."""
    gc.set_threshold(*MANY_NODES_GC_THRESHOLDS)
    keep_freed_blocks()
    cores = os.cpu_count() or 1
    threads = max(1, cores // (workers or cores))
    use_training_last_pool(loop, threads)
    return threads
