"""A worker hosting several nodes (`runtime.placement = "shared"` or `"ray"`).

The nodes are asyncio tasks on one event loop, with one torch import, one data cache and one
thread pool for their training between them; each keeps its own HTTP endpoint, keys and
round loop, so between nodes everything still crosses the signed wire on loopback, as in a
deployment. Training runs in worker threads (`asyncio.to_thread`), so one node's fit never
stops the others from serving.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from p2pfl.runtime.config import NodeConfig, load_node_config
from p2pfl.runtime.node import Node, RoundCallback

LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


async def host_nodes(configs: Sequence[NodeConfig], *, resume: bool = False,
                     on_round: RoundCallback | None = None) -> list[dict[str, Any]]:
    """Build and run every node of `configs` on this event loop; their results, in order."""
    nodes = [Node(c, resume=resume, on_round=on_round) for c in configs]
    return list(await asyncio.gather(*(n.run() for n in nodes)))


def run_worker(config_paths: Sequence[Path], resume: bool = False) -> int:
    """Run every node of `config_paths` in this process; exit status 1 if any of them failed."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=LOG_FORMAT)
    results = asyncio.run(host_nodes([load_node_config(p) for p in config_paths], resume=resume))
    return 1 if any(r["status"] == "failed" for r in results) else 0
