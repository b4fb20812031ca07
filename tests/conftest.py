from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import torch

# Tests share 2 cores with the node processes they start.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker more than the cores. A quarter of a worker's time went to waiting
    (timeouts, Ray's and the browser's start, a host that is down) while its test used no CPU,
    which a third worker fills. On 2 cores the suite measured 426-509 s with three workers (nine
    runs) and 480 and 500 s with two: the spread between runs is larger than the difference."""
    return len(os.sched_getaffinity(0)) + 1 if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1) + 1


_UNGROUPED = pytest.StashKey[set[str]]()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`--dist loadgroup` runs each `xdist_group` on one worker (the placement comparisons share
    one run there) by adding the group to each test's id. With pytest 9.2 and pytest-xdist 3.8 the
    id ignores it (pytest-dev/pytest-xdist#1386) and a group was spread over every worker without
    a word; now each of its tests fails, saying so."""
    config.stash[_UNGROUPED] = {item.nodeid for item in items if getattr(config.option, "loadgroup", False)
                                and item.get_closest_marker("xdist_group") and "@" not in item.nodeid}


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.nodeid in item.config.stash.get(_UNGROUPED, set()):
        pytest.fail("--dist loadgroup did not keep this test's xdist_group on one worker: this pytest and "
                    "pytest-xdist ignore the group (pytest-dev/pytest-xdist#1386; pyproject.toml pins pytest < 9.2)",
                    pytrace=False)


# What a test starts that makes it slow: Python (a node, a worker, a command), Ray, a browser.
# Tools a library runs once a process, whichever test comes first (git for a run's version,
# ldconfig for ctypes), are not counted: they would make the check depend on the order.
OURS = ("python", "p2pfl", "ray", "chromium", "chromedriver")


def _is_ours(executable: str) -> bool:
    name = os.path.basename(executable)
    return executable == sys.executable or name.startswith(OURS)


@pytest.fixture(autouse=True)
def _a_test_that_starts_a_process_is_marked_slow(request: pytest.FixtureRequest,
                                                 monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`-m "not slow"` is the fast inner loop (README): a test that starts a process (a node, a
    worker, a command, Ray) without the `slow` mark fails, naming what it started."""
    if request.node.get_closest_marker("slow") is not None:
        yield
        return
    started: list[str] = []
    execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]
    process_start = multiprocessing.process.BaseProcess.start

    def popen(self: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> Any:
        argv = [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()
        if argv and _is_ours(argv[0]):
            started.append(" ".join(argv))
        return execute_child(self, args, *rest, **kw)

    def start(self: multiprocessing.process.BaseProcess) -> None:
        started.append(f"multiprocessing {self.name}")
        process_start(self)

    import p2pfl.hosting.process as hosting_process

    take_warm = hosting_process.take

    def take() -> Any:  # a forking parent another test left warm: its nodes are processes all the same
        warm = take_warm()
        if warm is not None:
            started.append("p2pfl forked (the warm forking parent)")
        return warm

    monkeypatch.setattr(hosting_process, "take", take)
    monkeypatch.setattr(subprocess.Popen, "_execute_child", popen)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", start)
    yield
    if started:
        pytest.fail(f"starts a process ({started[0][:160]}) without @pytest.mark.slow", pytrace=False)
