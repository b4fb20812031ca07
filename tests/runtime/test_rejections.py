"""Malformed, unsigned, forged, replayed, oversized and NaN messages sent to a live node.

Each is rejected with its status; the node's model and peer table stay as they were and
the node keeps serving, then finishes its rounds.
"""

from __future__ import annotations

import asyncio
import struct

import aiohttp
import numpy as np
import torch

from p2pfl.models import part_state
from p2pfl.runtime.config import NodeConfig, PeerInfo
from p2pfl.runtime.node import Node
from p2pfl.scenario.launcher import free_ports
from p2pfl.scenario.schema import load_scenario
from p2pfl.wire import NodeKey, encode

from .helpers import write_tiny

LIMIT = 4 * 2**20


def _node(tmp_path, peer_key: NodeKey) -> Node:
    scenario = load_scenario(write_tiny(tmp_path, nodes=2, rounds=2, timeout=2.0))
    node_port, peer_port = free_ports(2, "127.0.0.1")
    key = NodeKey.generate()
    key.save(tmp_path / "node-0.key")
    config = NodeConfig(
        id="node-0", index=0, host="127.0.0.1", port=node_port, key_file=tmp_path / "node-0.key",
        scenario=tmp_path / "tiny.toml", out=tmp_path / "run",
        peers={"node-1": PeerInfo(f"http://127.0.0.1:{peer_port}", peer_key.public_hex)},
    )
    return Node(config, scenario)


def _frame(key: NodeKey, node: Node, *, sender: str = "node-1", recipient: str = "node-0", seq: int = 1,
           tensors: dict | None = None, part: str = "body") -> bytes:
    tensors = tensors if tensors is not None else {k: v.clone() for k, v in part_state(node.model, part).items()}
    return encode(key=key, kind="model", sender=sender, recipient=recipient, round=1, version=1, seq=seq,
                  part=part, meta={"n_train": 10}, tensors=tensors)


def _with_zero_signature(frame: bytes) -> bytes:
    (header_len,) = struct.unpack(">I", frame[5:9])
    start = 9 + header_len
    return frame[:start] + bytes(64) + frame[start + 64:]


def test_bad_messages_are_rejected_and_change_nothing(tmp_path):
    peer_key = NodeKey.generate()
    node = _node(tmp_path, peer_key)
    inbox = f"http://127.0.0.1:{node.config.port}/v1/inbox"
    before = {k: v.clone() for k, v in node.model.state_dict().items()}

    body = part_state(node.model, "body")
    nan_body = {k: v.clone() for k, v in body.items()}
    next(iter(nan_body.values()))[..., 0] = float("nan")
    wrong_shape = {k: v.clone() for k, v in body.items()}
    first = next(iter(wrong_shape))
    wrong_shape[first] = torch.zeros(*wrong_shape[first].shape[:-1], wrong_shape[first].shape[-1] + 1)
    stranger = NodeKey.generate()
    valid = _frame(peer_key, node, seq=100)
    cases = {
        "malformed": (b"this is not a frame", 400),
        "truncated": (valid[: len(valid) // 2], None),  # 400 or 401, but never accepted
        "unsigned": (_with_zero_signature(_frame(peer_key, node, seq=2)), 401),
        "forged": (_frame(stranger, node, seq=3), 401),
        "unknown sender": (_frame(stranger, node, sender="mallory", seq=4), 403),
        "wrong recipient": (_frame(peer_key, node, recipient="node-7", seq=5), 403),
        "oversized": (b"\0" * (LIMIT + 1), 413),
        "NaN weights": (_frame(peer_key, node, seq=6, tensors=nan_body), 422),
        "shape mismatch": (_frame(peer_key, node, seq=7, tensors=wrong_shape), 422),
    }

    async def scenario() -> dict[str, int]:
        await node.endpoint.start(node.config.host, node.config.port)
        statuses: dict[str, int] = {}
        try:
            async with aiohttp.ClientSession() as session:
                for name, (data, _) in cases.items():
                    async with session.post(inbox, data=data) as resp:
                        statuses[name] = resp.status
                async with session.post(inbox, data=valid) as resp:
                    statuses["valid"] = resp.status
                async with session.post(inbox, data=valid) as resp:
                    statuses["replayed"] = resp.status
                async with session.get(f"http://127.0.0.1:{node.config.port}/v1/status") as resp:
                    statuses["status"] = resp.status
        finally:
            await node.endpoint.close()
        return statuses

    statuses = asyncio.run(scenario())
    for name, (_, expected) in cases.items():
        if expected is None:
            assert 400 <= statuses[name] < 500, name
        else:
            assert statuses[name] == expected, f"{name}: got {statuses[name]}, expected {expected}"
    assert statuses["valid"] == 202
    assert statuses["replayed"] == 409
    assert statuses["status"] == 200
    # Only the one valid message reached the peer table; the model itself is untouched.
    assert list(node.peer_cache) == [("node-1", "body")]
    for k, v in node.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert len(node.endpoint.rejected) == len(cases) + 1


def test_node_keeps_running_under_bad_traffic(tmp_path):
    """The node trains its rounds while a stream of bad messages hits its inbox."""
    peer_key = NodeKey.generate()
    node = _node(tmp_path, peer_key)
    inbox = f"http://127.0.0.1:{node.config.port}/v1/inbox"
    nan_body = {k: torch.full_like(v, float("nan")) for k, v in part_state(node.model, "body").items()}

    async def scenario() -> dict:
        task = asyncio.create_task(node.run())
        sent = 0
        async with aiohttp.ClientSession() as session:
            for i in range(40):  # bounded: 40 bad messages over a few seconds
                if task.done():
                    break
                data = _frame(peer_key, node, seq=1000 + i, tensors=nan_body) if i % 2 else np.random.bytes(256)
                try:
                    async with session.post(inbox, data=data) as resp:
                        assert resp.status in (400, 422)
                        sent += 1
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.1)
        result = await asyncio.wait_for(task, timeout=120)
        result["sent"] = sent
        return result

    result = asyncio.run(scenario())
    assert result["status"] == "ok"
    assert [r["round"] for r in result["rounds"]] == [1, 2]
    assert result["sent"] > 0
    assert len(result["rejected"]) >= result["sent"]
