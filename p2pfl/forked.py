"""`p2pfl forked CONFIG...`: each node in its own OS process, forked from this one once it has
imported torch and the code that builds nodes (`runtime.placement = "process"` with
`runtime.start_method` "fork", the default on Linux); the same for the worker processes of
`placement = "shared"`, each forked to host its share of the nodes (`p2pfl run` hands them over).

Four fresh interpreters importing torch on two cores were most of the quickstart's start-up;
forked, the import is paid once and the children share its pages copy-on-write. Each child is
what `p2pfl node CONFIG` (or `p2pfl worker CONFIG...`) would be: its own event loop, port, log
file (RUN/logs/<id>.log, or <worker>.log) and exit status; its progress lines go to this
process's stdout (one write each, so lines from different children never mix), which the
launcher reads. The parent runs no torch operation before forking (a thread pool started before
fork would be lost in the children), forwards SIGTERM to its children, leaves Ctrl-C to reach
them from the terminal, and exits with the worst of their statuses once all have ended. While
they run, RUN/pids.json names each node's process; each child that ends is a line on stdout for
each of its nodes (`EXIT_PREFIX`, the node's id and the exit status), so the launcher knows each
node's own status at once.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import p2pfl.assembly  # noqa: F401  (imported once, before any fork: the point of forking)
from p2pfl.data import read_ahead
from p2pfl.hosting import tie_to_parent
from p2pfl.runtime.config import load_node_config
from p2pfl.runtime.run_folder import RunFolder
from p2pfl.runtime.status import EXIT_PREFIX
from p2pfl.runtime.strategy import COORDINATOR_ID
from p2pfl.scenario.schema import load_scenario


def _import_what_each_child_would() -> None:
    """Import, once and before any fork, the modules a node imports lazily as it starts: else
    every child imported them again, 1.1 s of CPU each (the quickstart's CPU, all processes:
    10.2 s before, 7.4 s after; `python benchmarks/quickstart_startup.py`)."""
    import networkx  # noqa: F401  (runtime.topology's graphs)
    import numpy.ma  # noqa: F401  (np.load of a cached dataset)
    import torch._dynamo  # noqa: F401  (torch's optimizers, at their first step: 0.8 s)
    from aiohttp import web  # noqa: F401  (the HTTP carrier's server)

    from p2pfl.algorithms import available
    from p2pfl.runtime.transport import CARRIERS, transport_factory

    available()  # every built-in algorithm's module
    for name in CARRIERS:
        transport_factory(name)


_import_what_each_child_would()


def _child(name: str, paths: Sequence[Path], run: Callable[[str, Sequence[Path]], int]) -> int:
    if sys.platform.startswith("linux"):  # killed with its parent, as a spawned node is with the launcher's kill
        tie_to_parent()
    log_path = RunFolder(load_node_config(paths[0]).out).log(name)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 2)
    os.close(log)
    return run(name, paths)


def run_forked_when_told(run: Callable[[str, Sequence[Path], bool], int]) -> int:
    """`p2pfl forked --wait`: imported and waiting (started by the launcher before its checks,
    `p2pfl.hosting.warm`); one JSON line on stdin names the hosts (a process's name -> its
    configs), whether they resume (a run resumed by the launcher resumes together) and this
    process's log. End of input: no run."""
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    order = json.loads(line)
    log = os.open(order["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(log, 2)
    os.close(log)
    hosts = {name: [Path(p) for p in paths] for name, paths in order["hosts"].items()}
    _read_data_ahead([p for paths in hosts.values() for p in paths])
    return run_forked(hosts, lambda name, paths: run(name, paths, bool(order["resume"])))


def _read_data_ahead(paths: Sequence[Path]) -> None:
    """The run's data set and assignment, read once here for every child to share (two workers
    each read Fashion-MNIST's 55 MB before, and each made the assignment of every node)."""
    for path in paths:
        config = load_node_config(path)
        if config.federation is None and config.id != COORDINATOR_ID:  # a member's data is its host's own
            scenario = load_scenario(config.scenario, config.overrides)
            read_ahead(scenario.data, scenario.nodes, scenario.seed)
            return


def run_forked(hosts: Mapping[str, Sequence[Path]], run: Callable[[str, Sequence[Path]], int]) -> int:
    """Fork one child per host (name -> node configs: one node's, placement "process", or a
    worker's share, "shared"), each running `run(name, configs)` (the CLI's `p2pfl node` or `p2pfl
    worker` entry, so a stop is one line and an exit status as there); the worst of their statuses."""
    children: dict[int, str] = {}
    # What the parent made lives as long as the children: out of their collector's sight, its
    # pages stay shared instead of being copied when a collection walks them.
    gc.freeze()
    for name, paths in hosts.items():
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _child(name, paths, run)
            except BaseException:  # noqa: BLE001  (whatever it was, the child must not return into the parent's loop)
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children[pid] = name

    def forward(signum: int, frame: object) -> None:
        for pid in children:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    nodes = {name: [p.stem for p in paths] for name, paths in hosts.items()}
    first = next((paths[0] for paths in hosts.values() if paths), None)
    folder = RunFolder(load_node_config(first).out) if first is not None else None
    running = {node: pid for pid, name in children.items() for node in nodes[name]}
    if folder is not None:
        folder.write_pids(running)
    signal.signal(signal.SIGTERM, forward)
    # Ctrl-C at a terminal reaches every child itself (one process group): passed on as well, a
    # child would be interrupted twice, the second time in its clean-up.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worst = 0
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        name = children.pop(pid, None)
        code = os.waitstatus_to_exitcode(status)
        worst = max(worst, code if code >= 0 else 128 - code)
        if name is not None:
            for node in nodes[name]:
                running.pop(node, None)
            if folder is not None:
                folder.write_pids(running)
            for node in nodes[name]:  # a line a write: a pipe keeps a write of under 4 KiB whole
                sys.stdout.write(EXIT_PREFIX + json.dumps({"id": node, "code": code}) + "\n")
                sys.stdout.flush()
    return worst
