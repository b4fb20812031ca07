"""The pool of a worker of many nodes: any other work before training, each in the order it came."""

from __future__ import annotations

import asyncio
import threading

import pytest

from p2pfl.runtime.worker_pool import (
    TrainingLastPool,
    run_training,
    use_training_last_pool,
)


def test_other_work_goes_before_queued_training_and_each_keeps_its_order() -> None:
    pool = TrainingLastPool(1)
    ran: list[str] = []
    hold = threading.Event()
    try:
        first = pool.submit_training(lambda: hold.wait(30))  # the one thread, busy
        trainings = [pool.submit_training(lambda i=i: ran.append(f"train-{i}")) for i in range(3)]
        others = [pool.submit(ran.append, f"other-{i}") for i in range(3)]
        hold.set()
        for future in (first, *trainings, *others):
            future.result(timeout=30)
    finally:
        pool.shutdown()
    assert ran == ["other-0", "other-1", "other-2", "train-0", "train-1", "train-2"]


def test_errors_reach_the_caller_and_a_shut_pool_refuses_work() -> None:
    pool = TrainingLastPool(2)
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(timeout=30)
    assert pool.submit_training(lambda: 7).result(timeout=30) == 7
    pool.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(print)
    with pytest.raises(ValueError, match="a thread at least"):
        TrainingLastPool(0)


def test_shutdown_can_cancel_what_waits_and_lets_the_running_finish() -> None:
    pool = TrainingLastPool(1)
    hold, started = threading.Event(), threading.Event()
    running = pool.submit(lambda: started.set() or (hold.wait(30) and "done"))
    assert started.wait(30)
    waiting = [pool.submit_training(print), pool.submit(print)]
    pool.shutdown(wait=False, cancel_futures=True)
    hold.set()  # the running work ends after the shutdown began
    pool.shutdown(wait=True)
    assert running.result(timeout=0) == "done"
    assert all(f.cancelled() for f in waiting)


def test_run_training_uses_the_loops_pool_only_where_it_was_set() -> None:
    async def names() -> tuple[str, str]:
        plain = await run_training(lambda: threading.current_thread().name)
        use_training_last_pool(asyncio.get_running_loop(), 1)
        pooled = await run_training(lambda: threading.current_thread().name)
        other = await asyncio.to_thread(lambda: threading.current_thread().name)
        assert other == pooled  # asyncio's own work goes to the same one thread
        return plain, pooled

    plain, pooled = asyncio.run(names())
    assert not plain.startswith("p2pfl-train") and pooled == "p2pfl-train_0"
