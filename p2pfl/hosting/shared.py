"""placement = "shared": worker processes (`python -m p2pfl worker CONFIG...`), each hosting a
share of the nodes on one event loop; `runtime.workers` of them, by default one per core."""

from __future__ import annotations

import os
from pathlib import Path

from p2pfl.hosting.process import ProcessHosting


class SharedHosting(ProcessHosting):
    def __init__(self, torch_threads: int, workers: int) -> None:
        super().__init__(torch_threads)
        self.workers = workers

    def plan(self, node_paths: list[Path]) -> dict[str, list[Path]]:
        """Nodes dealt round-robin over the workers."""
        workers = min(self.workers or os.cpu_count() or 1, len(node_paths))
        return {f"worker-{w}": node_paths[w::workers] for w in range(workers)}
