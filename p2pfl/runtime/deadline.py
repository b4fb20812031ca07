"""Waiting at most so long without ever losing a cancellation.

Ctrl-C reaches a node or coordinator as one cancellation of its main task (asyncio.run's own
SIGINT handler, Python 3.11+), and a stop after SIGTERM cancels every task once. Before Python
3.12, `asyncio.wait_for` dropped a cancellation that arrived in the same loop turn as the result
it waited for (it returned the result: CPython gh-86296); the process then ran on past Ctrl-C
until its last round. `asyncio.timeout` cancels the waiting task itself and counts cancellations,
so one from outside always wins.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def wait_at_most(awaitable: Awaitable[T], timeout: float) -> T:
    """`awaitable`'s result, or `TimeoutError` (= `asyncio.TimeoutError`) after `timeout` seconds
    (0 or less: one look); a cancellation from outside is always raised."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(max(timeout, 0.0)):
            return await awaitable
    return await asyncio.wait_for(awaitable, max(timeout, 0.0))  # 3.10: no asyncio.timeout; the old race stays
