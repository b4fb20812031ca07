"""The forking parent of `placement = "process"` and `"shared"` (`p2pfl forked`), started before
the launcher has checked the scenario, so that its imports run beside the launcher's checks.

`p2pfl run` forks it from its own process once it has imported the launcher (`commands/run.py`,
`warm_up(..., entry=...)`): torch, the node code and their objects are then one copy, shared
copy-on-write by the launcher, the parent and every node process (two interpreters importing
torch held about 160 MB of the same objects twice; `python benchmarks/memory_curve.py`). A caller
that is more than this command (a test, a script calling `run_loaded`: threads, torch already
run) starts `p2pfl forked --wait` instead, from `run_loaded` once the run passed its checks
(`warm_up_for`). The hosting `take`s the parent when its nodes' configs are written and hands
them over on its stdin. A run that ends before (a wrong field, an interrupted check) kills it
when the command returns (`discard`); it has done nothing but import.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from typing import IO

from p2pfl.hosting import FORKED, node_env, tie_to_parent


class ForkedHere:
    """The forking parent forked from this process: what the hosting uses of a `Popen`. Only
    `poll` reaps it, under a lock: the hosting waits for it on a thread while a stop polls it."""

    def __init__(self, pid: int, stdin: IO[bytes], stdout: IO[bytes]) -> None:
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self.returncode: int | None = None
        self._reaping = threading.Lock()

    def poll(self) -> int | None:
        with self._reaping:
            if self.returncode is None:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self) -> int:
        while (code := self.poll()) is None:
            try:
                os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)  # until it can be reaped; not reaped
            except ChildProcessError:  # a poll on another thread reaped it meanwhile
                pass
        return code

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # ended and reaped since
                os.kill(self.pid, signal.SIGKILL)


Warm = subprocess.Popen[bytes] | ForkedHere
_WARM: Warm | None = None


def _fork_here(torch_threads: int, entry: Callable[[], int]) -> ForkedHere:
    """Fork the parent from this process; it runs `entry` (`p2pfl forked --wait`) on pipes of its own."""
    order_read, order_write = os.pipe()
    lines_read, lines_write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    # Out of both processes' collections from now on, the imported objects' pages stay shared
    # instead of being copied where a collection walks them.
    gc.freeze()
    launcher = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(order_write)
            os.close(lines_read)
            os.dup2(order_read, 0)
            os.dup2(lines_write, 1)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            for fd in (order_read, lines_write, devnull):
                os.close(fd)
            sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115  (the process's own, for good)
            sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
            os.environ.update(node_env(torch_threads))
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the launcher's raises in its own code
            if sys.platform.startswith("linux"):
                tie_to_parent()
            if os.getppid() == launcher:  # else the launcher died before the tie: nothing to wait for
                code = entry()
        except BaseException:  # noqa: BLE001  (never return into the launcher's code)
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(order_read)
    os.close(lines_write)
    return ForkedHere(pid, os.fdopen(order_write, "wb"), os.fdopen(lines_read, "rb"))


def warm_up(torch_threads: int, entry: Callable[[], int] | None = None) -> None:
    """Start the forking parent: forked from this process running `entry` where given and this
    process runs nothing else (one thread: a fork copies only the calling one), else a fresh
    `p2pfl forked --wait`."""
    global _WARM
    if _WARM is not None:
        return
    if entry is not None and hasattr(os, "fork") and threading.active_count() == 1:
        _WARM = _fork_here(torch_threads, entry)
    else:
        _WARM = subprocess.Popen([sys.executable, "-m", "p2pfl", FORKED, "--wait"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=node_env(torch_threads),
                                 preexec_fn=tie_to_parent if sys.platform.startswith("linux") else None)
    atexit.register(discard)


def warm_up_for(placement: object, start_method: object, torch_threads: object,
                entry: Callable[[], int] | None = None) -> None:
    """`warm_up` if `runtime.placement` (as read, perhaps not yet checked) forks its processes."""
    from p2pfl.hosting import forks

    if placement not in ("process", "shared") or not forks(str(start_method)):
        return
    warm_up(torch_threads if isinstance(torch_threads, int) and torch_threads > 0 else 1, entry)


def take() -> Warm | None:
    """The warm forking parent, once, if it is still alive."""
    global _WARM
    proc, _WARM = _WARM, None
    return proc if proc is not None and proc.poll() is None else None


def discard() -> None:
    """Kill the warm forking parent nobody took (it has done nothing but import)."""
    proc = take()
    if proc is not None:
        proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


__all__ = ["ForkedHere", "Warm", "discard", "take", "warm_up", "warm_up_for"]
