"""A worker hands freed heap pages back (glibc's malloc_trim) and lifts its open-file limit."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

# In a child whose glibc keeps every freed block (blocks of a model's size come from the heap,
# and free() never trims it): what a worker's heap looks like after rounds of copies and frames.
CHILD = r"""
import json
from p2pfl.runtime.resources import release_freed_memory

def rss_kib():
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))

blocks = [b"x" * (400 * 1024) for _ in range(400)]  # ~160 MB
del blocks
freed = rss_kib()
released = release_freed_memory()
print(json.dumps({"freed": freed, "after": rss_kib(), "released": released}))
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
@pytest.mark.slow
def test_freed_blocks_of_a_models_size_go_back_to_the_os() -> None:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(2**40)}
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, check=True)
    got = json.loads(done.stdout)
    assert got["released"]
    assert got["after"] < got["freed"] - 100 * 1024, got  # at least 100 of the 160 MB came back


# Blocks a little larger each time, as a worker's copies of models are: glibc's moving threshold
# maps each one afresh, and every page of it faults on first touch.
GROWING_BLOCKS = r"""
import json, resource, sys
import numpy as np
from p2pfl.runtime.resources import keep_freed_blocks

kept = keep_freed_blocks() if sys.argv[1] == "keep" else None
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(40):
    block = np.ones((1 << 20) + i * 65536, dtype=np.uint8)
    del block
print(json.dumps({"kept": kept, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
@pytest.mark.slow
def test_freed_blocks_are_kept_for_the_next_ones_instead_of_faulted_in_again() -> None:
    def faults(mode: str) -> dict:
        done = subprocess.run([sys.executable, "-c", GROWING_BLOCKS, mode], capture_output=True, text=True, check=True)
        return json.loads(done.stdout)

    default, kept = faults("default"), faults("keep")
    assert kept["kept"] is True
    # 40 blocks of 1-3.5 MiB: about 22,000 pages faulted in by default; kept, only the growth.
    assert default["faults"] > 10_000 and kept["faults"] < default["faults"] / 5, (default, kept)


@pytest.mark.skipif(platform.system() == "Windows", reason="no RLIMIT_NOFILE")
@pytest.mark.slow
def test_the_open_file_limit_is_lifted_to_the_hard_one() -> None:
    child = ("import resource; from p2pfl.runtime.resources import raise_open_file_limit; "
             "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE); "
             "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard)); "
             "print(raise_open_file_limit(), hard)")
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)
    got, hard = map(int, done.stdout.split())
    assert got == hard


def test_a_worker_of_many_nodes_collects_less_often_and_trains_on_its_share_of_the_cores() -> None:
    import asyncio
    import gc

    from p2pfl.runtime.resources import MANY_NODES_GC_THRESHOLDS, host_many_nodes

    before = gc.get_threshold()

    async def body() -> tuple[int, set[str]]:
        threads = host_many_nodes(asyncio.get_running_loop(), workers=0)
        names = await asyncio.gather(*(asyncio.to_thread(lambda: __import__("threading").current_thread().name)
                                       for _ in range(8)))
        return threads, set(names)

    try:
        threads, names = asyncio.run(body())
        assert gc.get_threshold() == MANY_NODES_GC_THRESHOLDS
    finally:
        gc.set_threshold(*before)
    assert threads == 1 and all(n.startswith("p2pfl-train") for n in names) and len(names) <= threads


def test_a_nodes_other_work_waits_behind_at_most_the_pools_threads_of_training() -> None:
    """Ten nodes start training at once in a worker of many nodes; one node's other work (its
    aggregation) handed to the pool after them runs once a thread is free, not after all ten."""
    import asyncio
    import functools
    import gc
    import threading

    from p2pfl.runtime.resources import host_many_nodes
    from p2pfl.runtime.worker_pool import run_training

    before = gc.get_threshold()
    started: list[int] = []
    go = threading.Event()

    def train(i: int) -> int:
        started.append(i)
        go.wait(30)
        return i

    async def body() -> tuple[int, int, list[int]]:
        threads = host_many_nodes(asyncio.get_running_loop(), workers=0)
        trainings = [asyncio.ensure_future(run_training(functools.partial(train, i))) for i in range(10)]
        while len(started) < threads:  # the pool's threads have taken their first trainings
            await asyncio.sleep(0.01)
        other = asyncio.ensure_future(asyncio.to_thread(lambda: len(started)))
        await asyncio.sleep(0)  # its task runs first: the aggregation is in the pool's queue before a training ends
        go.set()
        return threads, await other, await asyncio.gather(*trainings)

    try:
        threads, trainings_begun_before_it, results = asyncio.run(body())
    finally:
        go.set()
        gc.set_threshold(*before)
    assert trainings_begun_before_it == threads == 1  # one per core: the pool's one thread
    assert results == list(range(10)) and started == list(range(10))  # every training, in the order they came


class _CountingStream:
    def __init__(self) -> None:
        self.text, self.flushes = "", 0

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        self.flushes += 1


def test_a_worker_of_many_nodes_sends_its_progress_lines_in_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's lines are kept and written together at the next periodic flush (and the last
    ones when its nodes are done): the launcher starts workers unbuffered, so a line printed is a
    write. A process of one node writes and flushes each line at once."""
    import asyncio

    from p2pfl.assembly import BatchedProgress, print_progress
    from p2pfl.runtime.status import PROGRESS_PREFIX

    stream = _CountingStream()
    monkeypatch.setattr(sys, "stdout", stream)
    print_progress({"id": "node-1", "round": 3})
    assert stream.flushes == 1 and stream.text.count(PROGRESS_PREFIX) == 1
    batched = BatchedProgress(stream)

    async def a_while_of_rounds() -> list[tuple[int, int]]:
        task = asyncio.ensure_future(batched.flush_every(0.05))
        seen = []
        for round_ in (1, 2):
            for node in range(3):
                batched({"id": f"node-{node}", "round": round_})
            seen.append((stream.text.count(PROGRESS_PREFIX), stream.flushes))  # nothing written yet
            await asyncio.sleep(0.2)
        batched({"id": "node-9", "round": 2})
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return seen

    assert asyncio.run(a_while_of_rounds()) == [(1, 1), (4, 2)]
    lines = stream.text.splitlines()
    assert len(lines) == 8 and stream.flushes == 4  # a write and a flush per batch, the last at the end
    assert json.loads(lines[-1][len(PROGRESS_PREFIX):]) == {"id": "node-9", "round": 2, "participated": True}


def test_many_asks_to_release_freed_memory_soon_make_one_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sixteen stalled readers aborted at once each ask; the heap is trimmed once, off the loop."""
    import asyncio
    import threading

    from p2pfl.runtime import resources

    calls: list[bool] = []
    monkeypatch.setattr(resources, "release_freed_memory",
                        lambda: calls.append(threading.current_thread() is not threading.main_thread()) or True)

    async def main() -> None:
        for _ in range(16):
            resources.release_soon(delay_s=0.01)
        await asyncio.sleep(0.3)
        resources.release_soon(delay_s=0.01)  # a later ask is a new release
        await asyncio.sleep(0.3)

    asyncio.run(main())
    if resources._malloc_trim() is None:
        assert calls == []
    else:
        assert calls == [True, True]


def test_trims_run_while_the_loop_is_busy_and_its_pool_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's loop can be busy for seconds with its thousands of nodes' arrivals, and its pool
    holds their queued training: the periodic trim is timed and run by a thread of its own, so it
    runs meanwhile (before: a loop-timed sleep, then a place in that pool)."""
    import asyncio
    import concurrent.futures
    import threading

    from p2pfl.runtime import resources

    if resources._malloc_trim() is None:
        pytest.skip("no malloc_trim in this C library: nothing is released periodically")
    trimmed = threading.Event()
    monkeypatch.setattr(resources, "release_freed_memory", lambda: trimmed.set() or True)

    async def main() -> bool:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(1))
        pool_free = threading.Event()
        queued = [asyncio.ensure_future(asyncio.to_thread(pool_free.wait)) for _ in range(50)]
        periodic = asyncio.ensure_future(resources.release_periodically(0.01))
        await asyncio.sleep(0)  # the periodic task starts
        try:
            return trimmed.wait(timeout=30)  # blocks the loop: only a trim from elsewhere ends it early
        finally:
            pool_free.set()
            periodic.cancel()
            await asyncio.gather(*queued, periodic, return_exceptions=True)

    assert asyncio.run(main())
