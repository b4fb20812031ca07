"""The threads of a process that hosts many nodes: any other work a node hands them before training.

A worker's thousands of nodes start a round together and queue their training at once (5000 at
10,000 nodes: over a minute of work). In a first-in-first-out pool that training stood before
every other piece of work a node hands the pool afterwards: the encoding of the part it
publishes (its peers wait for it) and its aggregation (which frees its running sum and its
peers' parts). At 10,000 nodes every node whose peers had all answered waited for the training
of every node behind it before it aggregated: the run peaked at 19-20 GB; with this pool,
12.9-13.7 (docs/benchmarks.md, issue 66). Letting only as many trainings into the pool as it has
threads put the other work first too, but a busy event loop then handed the pool its next training
seconds late, and a 1000-node run took 5-9 % longer. Here every training waits in the pool, fed
however busy the loop is, and a thread takes any other work first: the trainings keep the
order they came in.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class TrainingLastPool(concurrent.futures.ThreadPoolExecutor):
    """`threads` threads; `submit` is served before `submit_training`, each first in first out.
    A ThreadPoolExecutor by type only (asyncio's default executor must be one): none of its
    queue or threads is used."""

    def __init__(self, threads: int, name: str = "p2pfl-train") -> None:
        if threads < 1:
            raise ValueError(f"a pool needs a thread at least, got {threads}")
        super().__init__(threads, thread_name_prefix=name)  # its threads start on its own submit: never
        self._first: collections.deque[tuple[concurrent.futures.Future[Any], Callable[[], Any]]] = collections.deque()
        self._last: collections.deque[tuple[concurrent.futures.Future[Any], Callable[[], Any]]] = collections.deque()
        self._ready = threading.Condition()
        self._closed = False
        self._threads = [threading.Thread(target=self._serve, name=f"{name}_{i}", daemon=True) for i in range(threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        return self._put(self._first, functools.partial(fn, *args, **kwargs))

    def submit_training(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        return self._put(self._last, fn)

    def _put(self, queue: collections.deque[Any], call: Callable[[], T]) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._ready:
            if self._closed:
                raise RuntimeError("cannot schedule new work after the pool was shut down")
            queue.append((future, call))
            self._ready.notify()
        return future

    def _serve(self) -> None:
        while True:
            with self._ready:
                while not (self._first or self._last or self._closed):
                    self._ready.wait()
                if not (self._first or self._last):
                    return  # closed, and nothing left
                future, call = (self._first or self._last).popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = call()
            except BaseException as exc:  # noqa: BLE001  (handed to whoever awaits it, as ThreadPoolExecutor does)
                future.set_exception(exc)
            else:
                future.set_result(result)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._ready:
            self._closed = True
            if cancel_futures:
                for future, _ in (*self._first, *self._last):
                    future.cancel()
                self._first.clear()
                self._last.clear()
            self._ready.notify_all()
        if wait:
            for thread in self._threads:
                thread.join()


# Per loop that `host_many_nodes` gave a TrainingLastPool as its default executor.
_POOLS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, TrainingLastPool] = weakref.WeakKeyDictionary()


def use_training_last_pool(loop: asyncio.AbstractEventLoop, threads: int) -> TrainingLastPool:
    """Make a `TrainingLastPool` of `threads` the loop's default executor (`asyncio.to_thread`'s)."""
    pool = _POOLS[loop] = TrainingLastPool(threads)
    loop.set_default_executor(pool)
    return pool


async def run_training(train: Callable[[], T]) -> T:
    """`train()` on the loop's pool: after any other work waiting there, where `host_many_nodes`
    settled the loop; else as `asyncio.to_thread` runs it."""
    loop = asyncio.get_running_loop()
    pool = _POOLS.get(loop)
    if pool is None:
        return await asyncio.to_thread(train)
    context = contextvars.copy_context()  # as asyncio.to_thread passes it
    return await asyncio.wrap_future(pool.submit_training(functools.partial(context.run, train)), loop=loop)
