"""placement = "shared": worker processes (`python -m p2pfl worker CONFIG...`), each hosting a
share of the nodes on one event loop; `runtime.workers` of them, by default one per core. Where
the platform forks (`runtime.start_method`), `p2pfl run` warms up one forking parent while it
checks the scenario and writes the run folder, and each worker is forked from it once its
imports are done: they were 2.5-3 s of every worker's start on two cores (docs/benchmarks.md)."""

from __future__ import annotations

import os
from pathlib import Path

from p2pfl.hosting.process import ProcessHosting


class SharedHosting(ProcessHosting):
    def __init__(self, torch_threads: int, workers: int, fork: bool = False) -> None:
        super().__init__(torch_threads, fork)
        self.workers = workers

    def plan(self, node_paths: list[Path]) -> dict[str, list[Path]]:
        """Consecutive runs of `node_paths`, one a worker, as even as can be. The launcher lists
        the nodes in the topology's locality order (`Topology.locality_order`), so that most
        neighbours share a worker."""
        workers = min(self.workers or os.cpu_count() or 1, len(node_paths))
        bounds = [len(node_paths) * w // workers for w in range(workers + 1)]
        return {f"worker-{w}": node_paths[bounds[w]:bounds[w + 1]] for w in range(workers)}

    def cold_plan(self, node_paths: list[Path]) -> dict[str, list[Path]]:
        """No forking parent warm: each worker a fresh interpreter (one import each either way)."""
        return self.plan(node_paths)
