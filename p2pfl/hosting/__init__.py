"""Where a run's nodes live (`runtime.placement`), one module each, picked by lookup:

* `"process"` (process.py): one OS process per node;
* `"shared"` (shared.py): worker processes, each hosting a share of the nodes on one event loop;
* `"ray"` (ray.py): worker processes started by actors on a Ray cluster, on the cluster's hosts.

Every hosting starts `python -m p2pfl node | worker` processes and reads their progress lines
and exit statuses (`p2pfl.runtime.status`); none imports the code that builds nodes, so the
launcher above it never loads a model to start a run. A hosting says where its nodes listen
(`addresses`), starts them (`start`), and lets go of what it holds (`close`).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Protocol

from p2pfl.runtime.status import PROGRESS_ENV

Hosts = dict[str, tuple[list[str], Awaitable[dict[str, int]]]]  # host name -> its node ids, and their exit statuses
Progress = Callable[[int], None]  # rounds finished so far over every node of the run
# A run resumed by the launcher resumes every node at once: each replays from its own checkpoint,
# even where a neighbour's (synced later, as on Ray) holds a later round.
RESUME_TOGETHER = ["--resume", "--together"]
FORKED = "forked"  # the process that forks each node's (placement "process"), and its command: `p2pfl forked`


def node_env(threads: int) -> dict[str, str]:
    """The environment of a p2pfl process this launcher starts: unbuffered, `threads` BLAS threads."""
    return dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                **{PROGRESS_ENV: "1"})


def tie_to_parent() -> None:
    """(Linux, in the child before exec) killed when the process that started it dies."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


class Hosting(Protocol):
    # Set by the launcher before `start`: told of each node whose process ends, with its exit
    # status (< 0: the signal), as it ends.
    on_exit: Callable[[str, int], None] | None

    def addresses(self, ids: Sequence[str], coordinator: bool) -> dict[str, tuple[str, int]] | None:
        """id -> (host, port) where each node (and the coordinator) will listen; None: free ports
        on `runtime.host` of this machine."""

    async def start(self, out: Path, node_paths: list[Path], resume: bool,
                    progress: Progress) -> tuple[Hosts, Callable[[], None]]:
        """Start the nodes of `node_paths`; their hosts, and how to kill what is left of them."""

    def close(self) -> None: ...


def hosting_for(placement: str, *, workers: int, torch_threads: int, ray_address: str,
                start_method: str = "auto") -> Hosting:
    """The hosting of `runtime.placement` (`runtime.start_method`: how "process" and "shared" start their processes)."""
    from p2pfl.hosting.process import ProcessHosting
    from p2pfl.hosting.shared import SharedHosting

    def on_ray() -> Hosting:
        from p2pfl.hosting.ray import RayHosting  # Ray loads only where asked for

        return RayHosting(ray_address, workers, torch_threads)

    hostings: dict[str, Callable[[], Hosting]] = {
        "process": lambda: ProcessHosting(torch_threads, forks(start_method)),
        "shared": lambda: SharedHosting(torch_threads, workers, forks(start_method)),
        "ray": on_ray,
    }
    return hostings[placement]()


def forks(start_method: str) -> bool:
    """Whether "process" placement forks its nodes: "auto" does on Linux only (macOS forbids
    fork after system frameworks load; Windows has no fork)."""
    return start_method == "fork" or (start_method == "auto" and sys.platform.startswith("linux"))


__all__ = ["FORKED", "Hosting", "Hosts", "Progress", "forks", "hosting_for", "node_env", "tie_to_parent"]
