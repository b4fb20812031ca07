"""What a process hosting many nodes asks of the operating system: its freed memory handed back
while the nodes run, and room for a socket per neighbour.

Memory:

glibc keeps freed blocks for reuse, and after the first large block is freed it serves blocks
of a model's size (hundreds of KB) from its heaps instead of fresh mappings. A worker whose
nodes each copy, encode and receive several such blocks a round then holds the high-water
mark of every round's garbage: at 1000 nodes, about 2 MiB a node that nothing uses
(`python benchmarks/node_memory.py`). `malloc_trim` returns those pages; elsewhere than on
glibc this does nothing.

Files: every node holds a listening socket and a connection per neighbour it reads or serves;
500 nodes of a 20-regular graph in one process need over 20,000. `raise_open_file_limit`
lifts the soft limit to the hard one, as servers do at start; past the hard limit, nodes fail
with `Too many open files`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name).malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim with
        return None


def release_freed_memory() -> bool:
    """Give the heap's free pages back to the OS; False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


async def release_periodically(every_s: float) -> None:
    """`release_freed_memory` every `every_s` seconds, off the event loop, until cancelled."""
    if _malloc_trim() is None:
        return
    while True:
        await asyncio.sleep(every_s)
        await asyncio.to_thread(release_freed_memory)


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
