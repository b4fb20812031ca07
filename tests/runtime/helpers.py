from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from p2pfl.assembly import assemble_node
from p2pfl.models import part_state
from p2pfl.runtime.config import NodeConfig
from p2pfl.runtime.peers import PeerInfo
from p2pfl.runtime.node import Node
from p2pfl.hosting.ports import free_ports
from p2pfl.scenario.schema import load_scenario
from p2pfl.wire import NodeKey, Roster, encode, open_message

if TYPE_CHECKING:
    from p2pfl.runtime.coordinator import Coordinator

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
start_wait_s = 5
message_limit_mb = 4
"""


def write_tiny(tmp: Path, *, nodes: int = 3, rounds: int = 2, samples: int = 60, algorithm: str = "fedavg",
               timeout: float = 30.0, extra: str = "") -> Path:
    """A tiny scenario file; `extra` is TOML appended as it is (more tables: privacy, algorithm params)."""
    path = tmp / "tiny.toml"
    path.write_text(TINY.format(nodes=nodes, rounds=rounds, samples=samples, algorithm=algorithm, timeout=timeout)
                    + extra)
    return path


def scenario_of(node: Node) -> Any:
    """The resolved scenario a node was built from (the node itself holds only its settings)."""
    from p2pfl.scenario.schema import scenario_from_dict

    return scenario_from_dict(node.settings.resolved)


def build_in_process(scenario_path: Path, out: Path, overrides: tuple[str, ...] = ()) -> tuple[list[Node], Coordinator | None]:
    """Every node (and the coordinator) of a scenario as objects of this process, ready to `run()`."""
    from p2pfl.assembly import build_coordinator
    from p2pfl.runtime.config import load_node_config
    from p2pfl.scenario.launcher import write_run_folder
    from p2pfl.scenario.schema import apply_overrides, read_raw, scenario_from_dict

    scenario = scenario_from_dict(apply_overrides(read_raw(scenario_path), overrides), source=str(scenario_path))
    paths, coordinator_path = write_run_folder(scenario, out)
    nodes = [assemble_node(load_node_config(p), scenario) for p in paths]
    coordinator = None if coordinator_path is None else build_coordinator(load_node_config(coordinator_path), scenario)
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


def lone_node(tmp_path, peer_key: NodeKey, *, start_wait_s: float = 5.0, fetch_timeout_s: float = 2.0) -> Node:
    """node-0 of a 2-node scenario, built in this process; its one peer, node-1 (key `peer_key`), is
    never started: the node waits `start_wait_s` for it (traffic tests send while it does)."""
    scenario = load_scenario(write_tiny(tmp_path, nodes=2, rounds=2, timeout=fetch_timeout_s),
                             [f"runtime.start_wait_s={start_wait_s}"])
    node_port, peer_port = free_ports(2, "127.0.0.1")
    key = NodeKey.generate()
    key.save(tmp_path / "node-0.key")
    config = NodeConfig(
        id="node-0", index=0, host="127.0.0.1", port=node_port, key_file=tmp_path / "node-0.key",
        scenario=tmp_path / "tiny.toml", out=tmp_path / "run",
        peers={"node-1": PeerInfo(f"http://127.0.0.1:{peer_port}", peer_key.public_hex)},
    )
    return assemble_node(config, scenario)


def model_frame(key: NodeKey, node: Node, *, sender: str = "node-1", recipient: str = "node-0", seq: int = 1,
           tensors: dict | None = None, part: str = "body", meta: dict | None = None, version: int = 1) -> bytes:
    """A model-part frame from `sender` to `recipient`, signed by `key` (node-0's own part unless `tensors`)."""
    tensors = tensors if tensors is not None else {k: v.clone() for k, v in part_state(node.model, part).items()}
    return encode(key=key, kind="model", sender=sender, recipient=recipient, round=1, version=version, seq=seq,
                  part=part, meta={"n_train": 10} if meta is None else meta, tensors=tensors)


def recording_push(session: Any, base: str, statuses: dict[str, int]) -> Any:
    """`push(name, frame)`: POST a frame to the node at `base`'s inbox, keeping its HTTP status under `name`."""
    async def push(name: str, frame: bytes) -> None:
        async with session.post(f"{base}/v1/inbox", data=frame) as resp:
            statuses[name] = resp.status

    return push


@contextlib.asynccontextmanager
async def silent_peer(node: Node, peer: str = "node-1", answer: bytes | None = None) -> AsyncIterator[list[int]]:
    """`peer`'s address held by a host that accepts connections and never answers: a fetch from it
    waits its whole timeout (a machine that hangs), where a closed port is refused at once. With
    `answer`, the host reads each request's head, writes `answer` and closes the connection (a peer
    that dies mid-answer, or one that does not speak HTTP); it yields how many requests it took."""
    port = urlsplit(node.transport.peers[peer]).port
    held: list[asyncio.StreamWriter] = []
    requests = [0]

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        if answer is not None:
            await reader.readuntil(b"\r\n\r\n")
            requests[0] += 1
            writer.write(answer)
            await writer.drain()
            writer.close()

    server = await asyncio.start_server(hold, "127.0.0.1", port)
    try:
        yield requests
    finally:
        server.close()
        for writer in held:
            writer.close()
        await server.wait_closed()


def as_launched() -> dict[str, str]:
    """The environment a launcher gives the node processes it starts: they print a progress line
    per round on stdout (a node started by hand prints none), which these tests read."""
    import os

    from p2pfl.runtime.status import PROGRESS_ENV

    return {**os.environ, PROGRESS_ENV: "1"}


def interruptible() -> None:
    """`preexec_fn` for a process a test stops with SIGINT, as Ctrl-C at a terminal would: SIGINT
    back at its default, which Python turns into KeyboardInterrupt. A process started from a
    script's background job (`cmd &`, as CI may run the suite) inherits SIGINT ignored, and Python
    then installs no handler for it: the test would wait for a stop that never comes."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def through_wire(tensors: dict[str, Any], spec: dict) -> dict[str, Any]:
    """`tensors` sealed as a signed frame and opened again, checked against `spec`."""
    sender, receiver = NodeKey.generate(), NodeKey.generate()
    frame = encode(key=sender, kind="model", sender="a", recipient="b", round=1, version=1, seq=1, part="full",
                   meta={}, tensors=tensors)
    roster = Roster({"a": sender.public_hex, "b": receiver.public_hex})
    return open_message(frame, roster=roster, recipient="b", replay=None, expected=spec).torch_tensors()
