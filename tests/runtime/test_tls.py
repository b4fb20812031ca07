"""runtime.tls: nodes talk HTTPS with self-signed certificates pinned by fingerprint from the roster."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import tomllib
from pathlib import Path

import aiohttp
import pytest

from p2pfl.runtime.tls import certificate, fingerprint, pin
from p2pfl.wire import NodeKey

from .helpers import build_in_process, write_tiny


def test_certificate_is_a_function_of_the_key() -> None:
    key = NodeKey.generate()
    assert fingerprint(key, "node-0") == fingerprint(NodeKey.from_private_hex(key.private_hex()), "node-0")
    assert fingerprint(key, "node-0") != fingerprint(NodeKey.generate(), "node-0")
    cert = certificate(key, "node-0")
    assert cert.public_key().public_bytes_raw().hex() == key.public_hex


def test_nodes_run_over_tls_and_refuse_a_wrong_fingerprint(tmp_path: Path) -> None:
    path = write_tiny(tmp_path, nodes=3, rounds=1, samples=40, timeout=5.0, extra="")
    # node-2 sees node-0 up (its port takes connections) and starts; its reads of node-0 are refused
    # (it distrusts the certificate). Were it to wait for node-0, start_wait_s must stay well under
    # the others' 5 s fetch timeout, or whether they get node-2's model would be a race.
    nodes, _ = build_in_process(path, tmp_path / "run", overrides=("runtime.tls=true", "runtime.start_wait_s=1"))
    roster = tomllib.loads((tmp_path / "run" / "nodes" / "roster.toml").read_text())
    assert len(roster["node"]) == 3
    assert all(p["url"].startswith("https://") and len(p["tls_fingerprint"]) == 64 for p in roster["node"])
    # node-2 is told a wrong fingerprint for node-0: a man in the middle, as far as it can tell.
    nodes[2].transport._pins["node-0"] = pin("00" * 32)
    statuses: dict[str, object] = {}

    async def probes() -> None:
        url = nodes[0].transport.peers["node-1"]
        async with aiohttp.ClientSession() as session:
            for name, target, ssl in (("plain http", url.replace("https://", "http://"), None),
                                      ("no pin", url, True)):
                try:
                    async with session.get(f"{target}/v1/status", ssl=ssl, timeout=aiohttp.ClientTimeout(total=3)) as r:
                        statuses[name] = r.status
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    statuses[name] = type(exc).__name__

    async def everything() -> list:
        # node-1's server alone first, probed, then closed again: the run itself may be over sooner
        # than any sleep would guess.
        first, config = nodes[1].transport, nodes[1].config
        await first.start(config.host, config.port)
        try:
            await probes()
        finally:
            await first.close()
        return await asyncio.gather(*(n.run() for n in nodes))

    results = asyncio.run(everything())
    by_id = {r["id"]: r for r in results}
    assert all(r["status"] == "ok" for r in results)
    assert by_id["node-0"]["rounds"][0]["arrived"] == ["node-1", "node-2"]
    assert by_id["node-1"]["rounds"][0]["arrived"] == ["node-0", "node-2"]
    assert by_id["node-2"]["rounds"][0]["arrived"] == ["node-1"]
    assert any(c["reason"] == "tls_pin_mismatch" and c["sender"] == "node-0" for c in by_id["node-2"]["rejected"]["counts"])
    # Without TLS, or without the pin (a CA check of a self-signed certificate), nobody gets an answer.
    assert statuses["plain http"] != 200 and statuses["no pin"] != 200
    assert "Certificate" in str(statuses["no pin"]) or "SSL" in str(statuses["no pin"]), statuses


def test_roster_fingerprints_are_validated(tmp_path: Path) -> None:
    from p2pfl.errors import ConfigError
    from p2pfl.runtime.config import load_node_config

    config = {"id": "node-0", "index": 0, "port": 1, "key_file": "k", "scenario": "s",
              "peers": {"node-1": {"url": "https://h:1", "public_key": "ab" * 32, "tls_fingerprint": "xyz"}}}
    path = tmp_path / "node.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="peers.node-1.tls_fingerprint"):
        load_node_config(path)


def test_connections_that_never_finish_a_handshake_are_capped_and_timed_out(tmp_path: Path) -> None:
    """Review finding 7: Before, TLS connections were counted only after their handshake: 1 100 silent ones lived
    60 s each, took every file descriptor and wrote a traceback per failed accept."""
    import gc

    from p2pfl.runtime.transport import ServerLimits

    path = write_tiny(tmp_path, nodes=2, rounds=1, samples=40, timeout=5.0)
    nodes, _ = build_in_process(path, tmp_path / "run", overrides=("runtime.tls=true",))
    endpoint = nodes[0].transport
    endpoint.server_limits = ServerLimits(max_connections=4, handshake_timeout_s=3.0)
    seen: dict[str, object] = {}

    async def flood() -> None:
        await endpoint.start("127.0.0.1", nodes[0].config.port)
        try:
            silent = [await asyncio.open_connection("127.0.0.1", nodes[0].config.port) for _ in range(12)]
            await asyncio.sleep(0.3)
            seen["handshaking"] = len(endpoint.handshaking)

            async def closed(reader: asyncio.StreamReader) -> bool:
                try:
                    return await asyncio.wait_for(reader.read(1), 0.5) == b""
                except asyncio.TimeoutError:
                    return False
                except ConnectionError:
                    return True

            seen["closed_at_once"] = sum(await asyncio.gather(*(closed(reader) for reader, _ in silent)))
            await asyncio.sleep(3.0)  # past the handshake timeout
            gc.collect()
            seen["handshaking_after_timeout"] = len(endpoint.handshaking)
            async with aiohttp.ClientSession() as session:  # a peer that does shake hands gets in again
                async with session.get(f"https://127.0.0.1:{nodes[0].config.port}/v1/status", ssl=False) as r:
                    seen["status"] = r.status
            for _, writer in silent:
                writer.close()
        finally:
            await endpoint.close()

    asyncio.run(flood())
    assert seen["handshaking"] == 4 and seen["closed_at_once"] == 8
    assert seen["handshaking_after_timeout"] == 0
    assert seen["status"] == 200
    refused = [c for c in endpoint.rejections.summary()["counts"] if c["reason"] == "too_many_connections"]
    assert sum(c["count"] for c in refused) == 8


def test_connections_are_released_on_close_error_and_timeout_without_a_collection(
        tmp_path: Path) -> None:
    """Review finding 2 of issue 48: Before, a TLS connection's place under the cap while it shook hands was freed only by a full
    garbage collection: 520 silent connections held 1 s locked the node out (0 of 7 744
    handshakes, 0 of 28 reads, still at 65 s). Here with the collector off: 1 420 TLS and
    plain connections opened and dropped (closed, aborted, garbage sent, left to time out), the
    count returns to zero each time, and a peer's read gets in at once."""
    import gc
    import socket

    from p2pfl.runtime.transport import ServerLimits

    path = write_tiny(tmp_path, nodes=2, rounds=1, samples=40, timeout=5.0)
    nodes, _ = build_in_process(path, tmp_path / "run", overrides=("runtime.tls=true",))
    endpoint = nodes[0].transport
    endpoint.server_limits = ServerLimits(max_connections=64, handshake_timeout_s=1.0)
    port = nodes[0].config.port
    seen: dict[str, object] = {}

    class PeakCounted(set):
        """The handshaking set, recording the most places held at once (handshakes and open
        connections) whenever one is taken: the cap is checked at every step, not sampled."""
        peak = 0

        def add(self, item: object) -> None:
            super().add(item)
            PeakCounted.peak = max(PeakCounted.peak, len(self) + len(endpoint.connections))

    endpoint.handshaking = PeakCounted()

    def waiting_to_be_accepted() -> int:
        """Connections the kernel finished and the node has not accepted yet (the listening
        socket's rx_queue in /proc/net/tcp): empty sets with these still queued are not drained;
        each takes a place under the cap as it is accepted, and on a busy machine a read that
        came then found the cap full (connection reset)."""
        table = Path("/proc/net/tcp")
        for line in table.read_text().splitlines()[1:] if table.exists() else []:  # Linux; elsewhere the sets only
            fields = line.split()
            if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # LISTEN
                return int(fields[4].split(":")[1], 16)
        return 0

    # A condition polled, not a sleep: on an idle machine the storms drain in seconds; beside two
    # busy loops on two cores the whole test once took 51 s, most of it here.
    async def drained(name: str, seconds: float = 300.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while (endpoint.handshaking or endpoint.connections or waiting_to_be_accepted()) and loop.time() < deadline:
            await asyncio.sleep(0.02)
        seen[name] = (len(endpoint.handshaking), len(endpoint.connections), waiting_to_be_accepted())

    def storm(how: str, count: int) -> None:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port))
            if how == "garbage":
                sock.sendall(b"\x16\x03\x01\x00\x05hello")  # a broken ClientHello
            elif how == "reset":
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            sock.close()

    async def scenario() -> None:
        await endpoint.start("127.0.0.1", port)
        try:
            for how in ("close", "reset", "garbage"):
                await asyncio.to_thread(storm, how, 300)  # each storm several times the cap of 64
                await drained(how)
            silent = await asyncio.to_thread(  # the finding's storm, from another thread: the node accepts meanwhile
                lambda: [socket.create_connection(("127.0.0.1", port)) for _ in range(520)])
            await drained("silent, past the handshake timeout")
            for sock in silent:
                sock.close()
            await drained("silent, closed")
            assert seen["silent, closed"] == (0, 0, 0), seen  # else the reads below meet a full cap, not a bug
            # The reads below check that the cap gave its places back, not how fast a handshake is:
            # under a loaded suite one read's handshake outlasted the 1 s the storms were given.
            endpoint.server_limits = dataclasses.replace(endpoint.server_limits, handshake_timeout_s=30.0)
            async with aiohttp.ClientSession() as session:
                for _ in range(5):
                    async with session.get(f"https://127.0.0.1:{port}/v1/status", ssl=False) as r:
                        seen.setdefault("reads", []).append(r.status)  # type: ignore[union-attr]
            await drained("after the reads")
        finally:
            await endpoint.close()

    gc.disable()
    try:
        asyncio.run(scenario())
    finally:
        gc.enable()
    # The cap, counted before the handshake: held places never pass it, and it was reached (silent
    # ones past the 1 s handshake timeout give theirs back while the storm still comes).
    assert PeakCounted.peak <= 64
    refused = [c for c in endpoint.rejections.summary()["counts"] if c["reason"] == "too_many_connections"]
    assert sum(c["count"] for c in refused) > 0
    for name in ("close", "reset", "garbage", "silent, past the handshake timeout", "silent, closed", "after the reads"):
        assert seen[name] == (0, 0, 0), (name, seen[name])
    assert seen["reads"] == [200] * 5
