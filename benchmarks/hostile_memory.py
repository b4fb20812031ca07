"""A node's memory under a roster peer's memory attacks (issue 30, findings 4 and 5), measured
as the node process's resident set (VmRSS) before and during each attack.

One node (`p2pfl node`, a process of its own) of a 2-node tiny scenario with
`runtime.message_limit_mb = 64` trains its round 1, publishes, and then waits for its peer.
This script is that peer: it holds node-1's key, so every frame it sends is signed by a roster
member, and attacks:

* **uploads held a byte short**: 8 connections each announce a 64 MiB push, send a valid
  signed head and all of the body but its last byte, and hold. Every head is fresh (its own
  seq), so only the body budget (`runtime.buffered_mb`) stands between them and 512 MiB.
* **replayed heads**: the same 8 uploads, each reusing the head of a frame the node already
  accepted: refused before any body byte is read.
* **slow readers**: 40 signed reads of the node's model by a client that never reads an answer.

Printed per attack: the node's RSS increase (MiB) with the attack in place, against the budget,
and the HTTP answers seen. Run it twice to compare budgets:

    python benchmarks/hostile_memory.py                    # runtime.buffered_mb = 256 (default)
    python benchmarks/hostile_memory.py --buffered-mb 128
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from p2pfl.runtime.config import load_node_config
from p2pfl.scenario.launcher import write_run_folder
from p2pfl.scenario.schema import load_scenario
from p2pfl.wire import NodeKey, encode
from p2pfl.wire.envelope import head_length
from p2pfl.wire.request import AUTH_HEADER, request_for

SCENARIO = """
name = "hostile_memory"
nodes = 2
seed = 0
rounds = 2

[data]
dataset = "mnist"
partition = "iid"
samples_per_node = 64

[model]
name = "cnn"

[runtime]
message_limit_mb = 64
buffered_mb = {buffered_mb}
start_wait_s = 1
fetch_timeout_s = 600
linger_s = 1
"""
MIB = 2**20


def wait_for_round_1(port: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/status", timeout=2) as resp:
                if json.loads(resp.read()).get("round", 0) >= 1:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the node never reached round 1")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def held_upload(port: int, head: bytes, total: int) -> bytes:
    """POST `total` bytes: the head, then the body but its last byte; wait for an answer (or a stop)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST /v1/inbox HTTP/1.1\r\nHost: x\r\nContent-Length: {total}\r\n\r\n".encode() + head)
    remaining = total - len(head) - 1
    chunk = bytes(MIB)
    try:
        while remaining > 0:
            answered = reader.at_eof() or len(reader._buffer) > 0  # noqa: SLF001 - an early answer ends the upload
            if answered:
                break
            n = min(remaining, len(chunk))
            writer.write(chunk[:n])
            await writer.drain()
            remaining -= n
        return await asyncio.wait_for(reader.read(200), timeout=4.0)
    except (asyncio.TimeoutError, ConnectionError):
        return b"(held: no answer)"
    finally:
        writer.close()


def stalled_read(port: int, key: NodeKey, seq: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    token = request_for(key, "node-1", "node-0", "full", 1, seq)
    sock.sendall(f"GET /v1/parts/full?min_version=1 HTTP/1.1\r\nHost: x\r\n{AUTH_HEADER}: {token}\r\n\r\n".encode())
    return sock


def frame_head(key: NodeKey, seq: int, total: int) -> bytes:
    frame = encode(key=key, kind="model", sender="node-1", recipient="node-0", round=1, version=1, seq=seq,
                   part="full", meta={"n_train": 64}, tensors={"w": np.zeros(4, np.float32)})
    head = frame[: head_length(frame[:9], len(frame))]
    assert head_length(head[:9], total) == len(head)
    return head


async def uploads_held(port: int, pid: int, key: NodeKey) -> tuple[float, collections.Counter]:
    total = 64 * MIB
    before = rss_mib(pid)
    uploads = [asyncio.create_task(held_upload(port, frame_head(key, 100 + i, total), total)) for i in range(8)]
    await asyncio.sleep(6.0)
    peak = rss_mib(pid) - before
    answers = await asyncio.gather(*uploads)
    return peak, collections.Counter(a[:12].decode() for a in answers)


def model_tensors() -> dict:
    """The scenario's model, as the node expects a peer's "full" part."""
    import torch

    from p2pfl.models import build_model, part_state

    return {k: v.detach().to(torch.float32) for k, v in part_state(build_model("cnn", 1, 28, 10), "full").items()}


async def replayed_heads(port: int, pid: int, key: NodeKey) -> tuple[float, collections.Counter]:
    # A frame the node opens (and then refuses as a push it did not ask for): its seq is spent.
    frame = encode(key=key, kind="model", sender="node-1", recipient="node-0", round=1, version=1, seq=1,
                   part="full", meta={"n_train": 64}, tensors=model_tensors())
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST /v1/inbox HTTP/1.1\r\nHost: x\r\nContent-Length: {len(frame)}\r\n\r\n".encode() + frame)
    await writer.drain()
    first = await reader.read(200)
    writer.close()
    total = 64 * MIB
    head = frame[: head_length(frame[:9], len(frame))]
    before = rss_mib(pid)
    replays = [asyncio.create_task(held_upload(port, head, total)) for _ in range(8)]
    await asyncio.sleep(6.0)
    peak = rss_mib(pid) - before
    answers = await asyncio.gather(*replays)
    return peak, collections.Counter([f"first: {first[:12].decode()}", *(a[:12].decode() for a in answers)])


async def slow_readers(port: int, pid: int, key: NodeKey) -> tuple[float, collections.Counter]:
    before = rss_mib(pid)
    socks = [await asyncio.to_thread(stalled_read, port, key, 1000 + i) for i in range(40)]
    await asyncio.sleep(6.0)
    peak = rss_mib(pid) - before
    for s in socks:
        s.close()
    return peak, collections.Counter({"connections": len(socks)})


ATTACKS = {"8 uploads of 64 MiB held a byte short": uploads_held,
           "8 replayed heads announcing 64 MiB": replayed_heads,
           "40 signed reads never read": slow_readers}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--buffered-mb", type=float, default=256.0)
    args = parser.parse_args()
    print(f"runtime.buffered_mb = {args.buffered_mb:g}; each attack on a fresh node process")
    print(f"{'attack':<42} {'RSS at rest':>11} {'increase (MiB)':>14}  answers")
    for name, attack in ATTACKS.items():
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "hostile.toml"
            path.write_text(SCENARIO.format(buffered_mb=args.buffered_mb))
            paths, _ = write_run_folder(load_scenario(path), Path(tmp) / "run")
            config = load_node_config(paths[0])
            key = NodeKey.load(Path(tmp) / "run" / "keys" / "node-1.key")
            with open(Path(tmp) / "node-0.log", "wb") as log:
                node = subprocess.Popen([sys.executable, "-m", "p2pfl", "node", str(paths[0])],
                                        stdout=subprocess.DEVNULL, stderr=log, env=dict(os.environ, OMP_NUM_THREADS="1"))
            try:
                wait_for_round_1(config.port)
                time.sleep(5.0)  # round 1 trained and published; the node now waits for its peer
                rest = rss_mib(node.pid)
                increase, answers = asyncio.run(attack(config.port, node.pid, key))
            finally:
                node.kill()
                node.wait()
        print(f"{name:<42} {rest:>11.0f} {increase:>14.0f}  {dict(answers)}")


if __name__ == "__main__":
    main()
