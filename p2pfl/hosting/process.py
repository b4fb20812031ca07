"""placement = "process": one OS process per node (`python -m p2pfl node CONFIG`)."""

from __future__ import annotations

import asyncio
import json
import sys
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path

from p2pfl.hosting import FORKED, RESUME_TOGETHER, Hosts, Progress, node_env, tie_to_parent
from p2pfl.hosting.warm import Warm, take
from p2pfl.runtime.run_folder import RunFolder
from p2pfl.runtime.status import EXIT_PREFIX, PROGRESS_PREFIX

OnExit = Callable[[str, int], None]  # a node's process ended: its id and exit status (< 0: the signal)


# Every process `spawn` started and not yet reaped: their pipes must close while the loop runs.
_SPAWNED: "weakref.WeakSet[asyncio.subprocess.Process]" = weakref.WeakSet()


async def reap(timeout: float = 5.0) -> None:
    """Wait (up to `timeout`) for each process `spawn` started to exit, then close its pipes, inside
    the event loop: a subprocess transport collected after `asyncio.run` closed its loop (Ctrl-C)
    prints a traceback for each process."""
    procs = list(_SPAWNED)
    waits = [asyncio.ensure_future(p.wait()) for p in procs if p.returncode is None]
    if waits:
        await asyncio.wait(waits, timeout=timeout)
    for proc in procs:
        transport = getattr(proc, "_transport", None)
        if transport is not None and proc.returncode is not None:
            transport.close()
            _SPAWNED.discard(proc)


async def spawn(args: Sequence[str], log_path: Path, threads: int, *,
                die_with_parent: bool = False) -> asyncio.subprocess.Process:
    """A p2pfl process with `threads` BLAS threads, its stdout piped (progress lines), stderr to
    `log_path`. `die_with_parent` (Linux): killed when the process that started it dies, as a
    Ray actor's worker must be, or it would go on serving its nodes after its actor was lost."""
    env = node_env(threads)
    tie = tie_to_parent if die_with_parent and sys.platform.startswith("linux") else None
    with open(log_path, "ab") as log:
        proc = await asyncio.create_subprocess_exec(
            *args, stdout=asyncio.subprocess.PIPE, stderr=log, env=env, preexec_fn=tie,
        )
    _SPAWNED.add(proc)
    return proc


def read_line(line: bytes, tick: Callable[[], None], ended: OnExit | None) -> None:
    """A line of a node process's stdout: a round done (tick), or one of a forking parent's nodes ended."""
    text = line.decode(errors="replace")
    if text.startswith(PROGRESS_PREFIX):
        tick()
    elif text.startswith(EXIT_PREFIX) and ended is not None:
        try:
            node = json.loads(text[len(EXIT_PREFIX):])
            ended(str(node["id"]), int(node["code"]))
        except (ValueError, KeyError, TypeError):
            pass  # a torn line: the process's own exit status still covers the node


async def exit_after_progress(proc: asyncio.subprocess.Process, tick: Callable[[], None],
                              ended: OnExit | None = None) -> int:
    """Tick once per progress line `proc` prints (a round a node finished), tell `ended` of each
    node a forking parent reports ended; then the process's exit status."""
    assert proc.stdout is not None
    async for line in proc.stdout:
        read_line(line, tick, ended)
    return await proc.wait()


class ExitStatuses:
    """Each node's exit status as its process reports it, passed on to `ended` as it comes."""

    def __init__(self, ended: OnExit | None) -> None:
        self.ended, self.reported = ended, dict[str, int]()

    def heard(self, node: str, code: int) -> None:
        self.reported[node] = code
        if self.ended is not None:
            self.ended(node, code)

    def settle(self, nodes: list[str], code: int) -> dict[str, int]:
        """Each node's status: the one its forking parent reported, else its process's `code`
        (which then covers every node it hosted)."""
        for node in nodes:
            if node not in self.reported:
                self.heard(node, code)
        return {node: self.reported[node] for node in nodes}


async def follow(proc: asyncio.subprocess.Process, nodes: list[str], tick: Callable[[], None],
                 ended: OnExit | None = None) -> dict[str, int]:
    """Each of `nodes`' exit status, ticking on `proc`'s progress lines."""
    statuses = ExitStatuses(ended)
    return statuses.settle(nodes, await exit_after_progress(proc, tick, statuses.heard))


class ProcessHosting:
    def __init__(self, torch_threads: int, fork: bool = False) -> None:
        """`fork`: one process (`p2pfl forked`) imports torch and the node's code, then forks
        each node's process from itself; else each node is a fresh interpreter (`p2pfl node`)."""
        self.torch_threads, self.fork = torch_threads, fork
        self.on_exit: OnExit | None = None  # the launcher's: told of each node's process as it ends

    def plan(self, node_paths: list[Path]) -> dict[str, list[Path]]:
        """Process name -> the node configs it runs: here, one node each."""
        return {p.stem: [p] for p in node_paths}

    def cold_plan(self, node_paths: list[Path]) -> dict[str, list[Path]]:
        """What `start` spawns when no forking parent is warm: with `fork`, one (`p2pfl forked`)
        that forks each node's process after its one import."""
        return {FORKED: node_paths} if self.fork else self.plan(node_paths)

    def addresses(self, ids: Sequence[str], coordinator: bool) -> dict[str, tuple[str, int]] | None:
        return None

    async def start(self, out: Path, node_paths: list[Path], resume: bool,
                    progress: Progress) -> tuple[Hosts, Callable[[], None]]:
        procs: dict[str, asyncio.subprocess.Process] = {}
        hosts: Hosts = {}
        done = 0

        def tick() -> None:
            nonlocal done
            done += 1
            progress(done)

        warm = take() if self.fork else None
        if warm is not None:  # started before the scenario's checks: its imports are done by now
            return await self._hand_over(warm, out, self.plan(node_paths), resume, tick)
        folder, pids = RunFolder(out), {}  # a forking parent writes its children's pids itself

        def ended(node: str, code: int) -> None:
            if pids.pop(node, None) is not None:
                folder.write_pids(pids)
            if self.on_exit is not None:
                self.on_exit(node, code)

        for name, paths in self.cold_plan(node_paths).items():
            command = FORKED if name == FORKED else "node" if len(paths) == 1 and name == paths[0].stem else "worker"
            args = [sys.executable, "-m", "p2pfl", command, *map(str, paths)] + RESUME_TOGETHER * resume
            procs[name] = await spawn(args, folder.log(name), self.torch_threads)
            nodes = [p.stem for p in paths]
            if command != FORKED:
                pids.update(dict.fromkeys(nodes, procs[name].pid))
            hosts[name] = (nodes, follow(procs[name], nodes, tick, ended))
        if pids:
            folder.write_pids(pids)

        def kill() -> None:
            for p in procs.values():
                if p.returncode is None:
                    p.kill()

        return hosts, kill

    async def _hand_over(self, warm: Warm, out: Path, plan: dict[str, list[Path]], resume: bool,
                         tick: Callable[[], None]) -> tuple[Hosts, Callable[[], None]]:
        """Give the warm forking parent its processes to fork (one JSON line on its stdin) and follow it."""
        assert warm.stdin is not None and warm.stdout is not None
        node_paths = [p for paths in plan.values() for p in paths]
        order = {"hosts": {name: [str(p) for p in paths] for name, paths in plan.items()}, "resume": resume,
                 "log": str(RunFolder(out).log(FORKED))}
        warm.stdin.write(json.dumps(order).encode() + b"\n")
        warm.stdin.close()
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), warm.stdout)

        def kill() -> None:
            if warm.poll() is None:
                warm.kill()

        statuses = ExitStatuses(self.on_exit)

        async def followed() -> dict[str, int]:
            try:
                async for line in reader:
                    read_line(line, tick, statuses.heard)
                code = await asyncio.to_thread(warm.wait)
            except asyncio.CancelledError:
                kill()  # a stopped run: its nodes go before the pipe they write their progress to
                raise
            finally:
                transport.close()
            return statuses.settle([p.stem for p in node_paths], code)

        return {FORKED: ([p.stem for p in node_paths], followed())}, kill

    def close(self) -> None:
        pass
