"""Whether a peer is up, as a starting node waits for its neighbours: a port that takes the poll's
connection is a node up, answered in time or not (a 10,000-node worker busy with round 1 answered
polls too late, and 1400-1700 nodes of the other worker waited the whole `runtime.start_wait_s`)."""

from __future__ import annotations

import asyncio
import urllib.parse
from pathlib import Path

from p2pfl.wire import NodeKey

from .helpers import lone_node


def test_a_port_that_takes_the_connection_is_up_answered_or_not(tmp_path: Path) -> None:
    node = lone_node(tmp_path, NodeKey.generate())
    port = urllib.parse.urlsplit(node.transport.urls["node-1"]).port

    async def scenario() -> dict[str, bool]:
        await node.transport.start(node.config.host, node.config.port)
        out = {"nothing listens": await node.transport.is_up("node-1", 0.5)}
        held: list[asyncio.StreamWriter] = []

        async def busy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            held.append(writer)  # takes the connection, never answers

        async def answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
            await writer.drain()
            writer.close()

        for name, handler in (("busy", busy), ("answers", answers)):
            server = await asyncio.start_server(handler, "127.0.0.1", port)
            out[name] = await asyncio.wait_for(node.transport.is_up("node-1", 0.5), 10)
            server.close()
            for writer in held:
                writer.close()
            await server.wait_closed()
        out["unknown peer"] = await node.transport.is_up("node-9", 0.5)
        await node.transport.close()
        return out

    assert asyncio.run(scenario()) == {"nothing listens": False, "busy": True, "answers": True, "unknown peer": False}
