"""Stopping an asyncio process on SIGTERM the way asyncio stops it on Ctrl-C.

asyncio.run takes Ctrl-C as one cancellation of its main task, delivered between two loop turns.
SIGTERM used to raise an exception straight from a Python signal handler, wherever the main
thread was: inside the selector, a task's step or a callback of the loop itself, which asyncio
avoids for Ctrl-C because a task caught half-stepped can hold the loop's shutdown. `run_stoppable`
takes SIGTERM through the loop's own signal handling instead, and raises `Terminated` only once
the loop has closed.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill PID`, a scheduler, a CI timeout), taken the way Ctrl-C is: the launcher
    stops its nodes, writes what they finished and says how to resume."""


def raise_terminated(signum: int, frame: object) -> None:
    """The SIGTERM handler for a process's synchronous parts (no loop running)."""
    raise Terminated()


def run_stoppable(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)`; SIGTERM cancels `main` once, as Ctrl-C does, then `Terminated` is
    raised after the loop closed. Off the main thread (no signals there) it is plain asyncio.run."""
    terminated = False

    async def guarded() -> T:
        nonlocal terminated
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_sigterm() -> None:
            nonlocal terminated
            if not terminated:  # a second SIGTERM while stopping changes nothing
                terminated = True
                task.cancel()

        previous = signal.getsignal(signal.SIGTERM)
        try:
            loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        except (RuntimeError, ValueError, NotImplementedError):  # not the main thread, or no signals here
            return await main
        try:
            return await main
        finally:
            loop.remove_signal_handler(signal.SIGTERM)
            if previous is not None:  # remove_signal_handler leaves SIG_DFL; the caller's handler comes back
                signal.signal(signal.SIGTERM, previous)

    try:
        result = asyncio.run(guarded())
    except asyncio.CancelledError:
        if not terminated:
            raise
    if terminated:  # also where `main` took the cancellation and returned: the process was still told to stop
        raise Terminated()
    return result
