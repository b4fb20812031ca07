from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from p2pfl.coordinator.service import Coordinator
    from p2pfl.runtime.node import Node

TINY = """
name = "tiny"
nodes = {nodes}
seed = 0
rounds = {rounds}

[data]
dataset = "mnist"
partition = "iid"
samples_per_node = {samples}

[model]
name = "cnn"

[algorithm]
name = "{algorithm}"

[train]
epochs = 1
batch_size = 32

[runtime]
fetch_timeout_s = {timeout}
linger_s = 20
message_limit_mb = 4
"""


def write_tiny(tmp: Path, *, nodes: int = 3, rounds: int = 2, samples: int = 60, algorithm: str = "fedavg",
               timeout: float = 30.0, extra: str = "") -> Path:
    """A tiny scenario file; `extra` is TOML appended as it is (more tables: privacy, algorithm params)."""
    path = tmp / "tiny.toml"
    path.write_text(TINY.format(nodes=nodes, rounds=rounds, samples=samples, algorithm=algorithm, timeout=timeout)
                    + extra)
    return path


def build_in_process(scenario_path: Path, out: Path, overrides: tuple[str, ...] = ()) -> tuple[list[Node], Coordinator | None]:
    """Every node (and the coordinator) of a scenario as objects of this process, ready to `run()`."""
    from p2pfl.coordinator.service import Coordinator
    from p2pfl.runtime.config import load_node_config
    from p2pfl.runtime.node import Node
    from p2pfl.scenario.launcher import write_run_folder
    from p2pfl.scenario.schema import apply_overrides, read_raw, scenario_from_dict

    scenario = scenario_from_dict(apply_overrides(read_raw(scenario_path), overrides), source=str(scenario_path))
    paths, coordinator_path = write_run_folder(scenario, out)
    nodes = [Node(load_node_config(p), scenario) for p in paths]
    coordinator = None if coordinator_path is None else Coordinator(load_node_config(coordinator_path), scenario)
    return nodes, coordinator


def run_in_process(nodes: list[Node], coordinator: Coordinator | None) -> tuple[list[dict[str, Any]], dict[str, Any] | None, float]:
    """Run them all on one event loop, over real HTTP on 127.0.0.1; (node results, coordinator result, seconds)."""
    async def everything() -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        tasks = [asyncio.create_task(n.run()) for n in nodes]
        coord = None if coordinator is None else asyncio.create_task(coordinator.run())
        results = await asyncio.gather(*tasks)
        return list(results), (None if coord is None else await coord)

    started = time.perf_counter()
    results, coordinator_result = asyncio.run(everything())
    return results, coordinator_result, time.perf_counter() - started
