"""A cancellation that arrives in the loop turn the awaited thing finishes is never lost.

Ctrl-C reaches a node or coordinator as one cancellation of its main task; CI saw a coordinator
run on past SIGINT (asyncio.wait_for of Python 3.11 returned the result and dropped it)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable

import pytest

from p2pfl.runtime.deadline import wait_at_most
from p2pfl.runtime.transport.stores import PartStore


async def _cancelled_as_it_finishes(wait: Callable[[Awaitable[bool]], Awaitable[bool]]) -> str:
    """Cancels a task whose awaited event is set in the same loop turn: what the task did."""
    event = asyncio.Event()

    async def waiting() -> str:
        await wait(event.wait())
        return "ran on"

    task = asyncio.create_task(waiting())
    for _ in range(3):  # into the wait
        await asyncio.sleep(0)
    event.set()
    task.cancel()
    try:
        return await task
    except asyncio.CancelledError:
        return "cancelled"


def test_a_cancellation_as_the_wait_ends_is_raised():
    assert asyncio.run(_cancelled_as_it_finishes(lambda aw: wait_at_most(aw, 30.0))) == "cancelled"


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="asyncio.wait_for keeps the cancellation from Python 3.12")
def test_the_race_is_real_with_the_standard_wait_for():
    """What the runtime used before: the same cancellation is lost."""
    assert asyncio.run(_cancelled_as_it_finishes(lambda aw: asyncio.wait_for(aw, 30.0))) == "ran on"


def test_the_timeout_and_the_result_are_those_of_wait_for():
    async def main() -> tuple[str, bool]:
        async def late() -> str:
            await asyncio.sleep(10)
            return "late"

        async def soon() -> str:
            return "soon"

        with pytest.raises(asyncio.TimeoutError):
            await wait_at_most(late(), 0.01)
        with pytest.raises(asyncio.TimeoutError):
            await wait_at_most(late(), -1.0)
        return await wait_at_most(soon(), 0.0), True

    assert asyncio.run(main()) == ("soon", True)


def test_a_node_waiting_on_a_store_is_stopped_as_a_version_arrives():
    """A node's main task on the in-memory carriers waits on its peers' stores: a Ctrl-C that lands
    as the peer publishes still stops it."""

    async def main() -> str:
        store = PartStore(held_bytes=1 << 20)
        task = asyncio.create_task(store.wait_for(1, timeout=30.0))
        for _ in range(3):
            await asyncio.sleep(0)
        await store.sit_out(1)  # the version the waiter asked for is settled: it wakes
        task.cancel()
        try:
            await task
            return "ran on"
        except asyncio.CancelledError:
            return "cancelled"

    assert asyncio.run(main()) == "cancelled"


def test_the_runtime_does_not_use_asyncio_wait_for():
    from pathlib import Path

    import p2pfl

    users = [str(p) for p in Path(p2pfl.__file__).parent.rglob("*.py")
             if "asyncio.wait_for(" in p.read_text() and p.name != "deadline.py"]
    assert users == [], f"use p2pfl.runtime.deadline.wait_at_most: asyncio.wait_for loses a Ctrl-C before 3.12 ({users})"
