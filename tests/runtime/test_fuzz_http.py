"""Ten thousand hostile requests against a live node: no 5xx, no hang, nothing changed.

Inputs come from a seeded generator in ten categories (random bytes, bit-flipped, truncated
and extended frames, signed frames with random headers and metadata, random query strings,
auth headers, paths, methods and content encodings). Every request has a deadline; after
all of them the node still answers a signed read with its unchanged model.
"""

from __future__ import annotations

import asyncio
import random
import string
import struct
from pathlib import Path
from typing import Any

import aiohttp
import msgpack
import torch

from p2pfl.models import part_state
from p2pfl.runtime.devices import host_snapshot
from p2pfl.wire import NodeKey, open_message
from p2pfl.wire.request import AUTH_HEADER, request_for

from .helpers import lone_node, model_frame

INPUTS = 10_000
CATEGORIES = ("bytes", "bitflip", "truncate", "extend", "header", "meta", "query", "auth", "path", "encoding")


def _json_like(rng: random.Random, depth: int = 0) -> Any:
    choice = rng.randrange(9 if depth < 3 else 6)
    if choice == 0:
        return None
    if choice == 1:
        return rng.random() < 0.5
    if choice == 2:
        return rng.choice([0, -1, 1, 2**31, -(2**63), 2**64 - 1, rng.randrange(-10**9, 10**9)])
    if choice == 3:
        return rng.choice([float("nan"), float("inf"), -float("inf"), 3e38, -1e308, 0.5, rng.random()])
    if choice == 4:
        return "".join(rng.choice(string.printable) for _ in range(rng.randrange(0, 40)))
    if choice == 5:
        return "lots"
    if choice == 6:
        return [_json_like(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    return {rng.choice(["n_train", "weights", "xi", "reason", "x" * rng.randrange(1, 5)]): _json_like(rng, depth + 1)
            for _ in range(rng.randrange(0, 4))}


def _request(rng: random.Random, category: str, valid: bytes, key: NodeKey, node: Any, seq: int) -> dict[str, Any]:
    inbox = {"method": "POST", "path": "/v1/inbox", "headers": {}, "params": {}}
    if category == "bytes":
        return {**inbox, "data": rng.randbytes(rng.randrange(0, 2000))}
    if category == "bitflip":
        data = bytearray(valid)
        for _ in range(rng.randrange(1, 8)):
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
        return {**inbox, "data": bytes(data)}
    if category == "truncate":
        return {**inbox, "data": valid[: rng.randrange(len(valid))]}
    if category == "extend":
        return {**inbox, "data": valid + rng.randbytes(rng.randrange(1, 200))}
    if category == "header":
        doc = {k: _json_like(rng) for k in rng.sample(
            ["kind", "sender", "recipient", "round", "version", "seq", "timestamp", "part", "meta", "body_digest", "x"],
            rng.randrange(0, 11))}
        raw = msgpack.packb(doc, use_bin_type=True)
        signed = b"P2FL" + struct.pack(">BI", 2, len(raw)) + raw
        start = signed + key.sign(signed)
        return {**inbox, "data": start + bytes(-len(start) % 64) + rng.randbytes(rng.randrange(0, 300))}
    if category == "meta":
        meta = {"n_train": _json_like(rng)} if rng.random() < 0.7 else _json_like(rng)
        if not isinstance(meta, dict):
            meta = {"m": meta}
        try:
            data = model_frame(key, node, seq=seq, meta=meta, version=rng.choice([0, 1, 2, 2**40]),
                               part=rng.choice(["body", "head", "full", "global", "zzz"]))
        except (TypeError, ValueError):  # not even encodable: send the repr instead
            data = repr(meta).encode()
        return {**inbox, "data": data}
    if category == "query":
        params = {rng.choice(["wait", "min_version", "requester", "x"]): rng.choice(
            ["nan", "inf", "-inf", "-1", "1e309", str(2**70), "0", "0.5", "", "abc", "1" * 500]) for _ in range(3)}
        return {"method": "GET", "path": f"/v1/parts/{rng.choice(['full', 'body', 'head', 'global', '..', 'x'])}",
                "headers": {AUTH_HEADER: request_for(key, "node-1", "node-0", "full", 0, seq)} if rng.random() < 0.5 else {},
                "params": params}
    if category == "auth":
        token = rng.choice([
            "".join(rng.choice(string.hexdigits) for _ in range(rng.randrange(0, 300))),
            ".".join("".join(rng.choice(string.hexdigits) for _ in range(rng.randrange(0, 100))) for _ in range(2)),
            request_for(key, "node-1", "node-0", "full", 0, seq)[:-rng.randrange(1, 20)],
            request_for(NodeKey.generate(), "node-1", "node-0", "full", 0, seq),
        ])
        return {"method": "GET", "path": "/v1/parts/full", "headers": {AUTH_HEADER: token},
                "params": {"min_version": "0", "wait": "0"}}
    if category == "path":
        path = "/" + "/".join("".join(rng.choice(string.ascii_letters + "%._-") for _ in range(rng.randrange(0, 12)))
                              for _ in range(rng.randrange(1, 4)))
        return {"method": rng.choice(["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]), "path": path,
                "headers": {}, "params": {}, "data": rng.randbytes(rng.randrange(0, 50))}
    # encoding
    return {**inbox, "headers": {"Content-Encoding": rng.choice(["gzip", "deflate", "br", "x", "identity, gzip"]),
                                 "Content-Type": rng.choice(["application/x-p2pfl", "text/plain", ""])},
            "data": rng.choice([valid, rng.randbytes(100)])}


def test_ten_thousand_hostile_requests_get_no_5xx_and_change_nothing(tmp_path: Path) -> None:
    peer_key = NodeKey.generate()
    node = lone_node(tmp_path, peer_key)
    before = {k: v.clone() for k, v in node.model.state_dict().items()}
    rng = random.Random(20261122)
    statuses: dict[str, dict[int, int]] = {c: {} for c in CATEGORIES}

    async def scenario() -> bytes:
        await node.transport.start(node.config.host, node.config.port)
        await node.transport.publish(1, 1, {"full": host_snapshot(part_state(node.model, "full"))}, {"n_train": 10})
        base = f"http://127.0.0.1:{node.config.port}"
        valid = model_frame(peer_key, node, seq=1)
        timeout = aiohttp.ClientTimeout(total=10)
        try:
            async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session:
                async def one(i: int) -> None:
                    category = CATEGORIES[i % len(CATEGORIES)]
                    spec = _request(rng, category, valid, peer_key, node, seq=100 + i)
                    try:
                        async with session.request(spec["method"], base + spec["path"], params=spec["params"],
                                                   headers=spec["headers"], data=spec.get("data")) as resp:
                            await resp.read()
                            statuses[category][resp.status] = statuses[category].get(resp.status, 0) + 1
                    except aiohttp.ClientError:
                        statuses[category][0] = statuses[category].get(0, 0) + 1  # closed on us: allowed

                for start in range(0, INPUTS, 50):
                    await asyncio.gather(*(one(i) for i in range(start, min(start + 50, INPUTS))))
                headers = {AUTH_HEADER: request_for(peer_key, "node-1", "node-0", "full", 0, 10**6)}
                async with session.get(f"{base}/v1/parts/full?min_version=0&wait=0", headers=headers) as resp:
                    if resp.status == 429:  # the member that flooded is over its rate: it waits as told
                        await asyncio.sleep(int(resp.headers["Retry-After"]))
                    else:
                        assert resp.status == 200
                        return await resp.read()
                headers = {AUTH_HEADER: request_for(peer_key, "node-1", "node-0", "full", 0, 10**6 + 1)}
                async with session.get(f"{base}/v1/parts/full?min_version=0&wait=0", headers=headers) as resp:
                    assert resp.status == 200
                    return await resp.read()
        finally:
            await node.transport.close()

    served = asyncio.run(scenario())
    server_errors = {c: {s: n for s, n in by.items() if s >= 500} for c, by in statuses.items()}
    assert not any(server_errors.values()), server_errors
    assert sum(n for by in statuses.values() for n in by.values()) == INPUTS
    # Closed connections are the exception (garbage that is not even HTTP), not the rule.
    assert sum(by.get(0, 0) for by in statuses.values()) < INPUTS // 100, statuses
    for k, v in node.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    from p2pfl.wire import Roster

    message = open_message(served, roster=Roster({"node-0": node.parts.key.public_hex}), recipient="node-1", replay=None)
    for k, v in message.torch_tensors().items():
        assert torch.equal(v, before[k]), k
    assert node.transport.rejections.summary()["total"] > INPUTS // 2
    assert len(node.transport.rejections.summary()["recent"]) <= 100
