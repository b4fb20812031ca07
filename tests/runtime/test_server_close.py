"""A connection accepted as a node's server closes is closed at once: its handler came after
aiohttp's shutdown had woken the idle ones, and it held the close for the whole grace
(`SHUTDOWN_GRACE_S`), and its poller as long or until its timeout (the last nodes of a 1000-node
run lingered 2-5 s after the last round, polling neighbours that closed)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from p2pfl.runtime.transport import ServerLimits
from p2pfl.wire import NodeKey

from .helpers import lone_node

GRACE_S = 20.0  # the header deadline: far above any bound below


def test_a_connection_accepted_while_the_server_closes_is_closed_at_once(tmp_path: Path) -> None:
    node = lone_node(tmp_path, NodeKey.generate())
    node.transport.server_limits = ServerLimits(read_timeout_s=GRACE_S)

    async def scenario() -> tuple[bytes, int]:
        await node.transport.start(node.config.host, node.config.port)
        try:
            node.transport.closing = True  # as between `_close_server`'s first step and its last
            reader, writer = await asyncio.open_connection("127.0.0.1", node.config.port)
            writer.write(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n")
            end = await asyncio.wait_for(reader.read(), GRACE_S / 4)
            writer.close()
            return end, len(node.transport.connections)
        finally:
            node.transport.closing = False
            await node.transport.close()

    assert asyncio.run(scenario()) == (b"", 0)


@pytest.mark.parametrize("restart", [False, True])
def test_a_server_started_again_serves_again(tmp_path: Path, restart: bool) -> None:
    """The closing mark is the closing server's: a node that listens again (churn's rejoin) answers."""
    node = lone_node(tmp_path, NodeKey.generate())

    async def scenario() -> bytes:
        await node.transport.start(node.config.host, node.config.port)
        if restart:
            await node.transport.stop_listening()
            await node.transport.listen()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", node.config.port)
            writer.write(b"GET /v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = await asyncio.wait_for(reader.read(), GRACE_S / 4)
            writer.close()
            return answer
        finally:
            await node.transport.close()

    assert asyncio.run(scenario()).startswith(b"HTTP/1.1 200")


def test_a_connection_accepted_just_before_the_listener_closes_is_closed_not_left_open(tmp_path: Path) -> None:
    """Accepted by the loop, its transport not made yet, when the node closes: asyncio (3.11) then
    dropped it without closing its socket, and the poller waited for its own timeout."""
    import socket

    node = lone_node(tmp_path, NodeKey.generate())
    node.transport.server_limits = ServerLimits(read_timeout_s=GRACE_S)

    async def scenario() -> bytes:
        await node.transport.start(node.config.host, node.config.port)
        client = socket.create_connection(("127.0.0.1", node.config.port))  # complete in the kernel
        client.sendall(b"GET /v1/status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        await asyncio.sleep(0)  # one turn of the loop accepts it (`_accept_connection`); the next makes its transport
        await node.transport.close()
        client.settimeout(GRACE_S / 4)  # left open, the read waits for this and fails the test
        try:
            return await asyncio.to_thread(client.recv, 4096)
        except ConnectionResetError:  # closed with the request unread
            return b""
        finally:
            client.close()

    answer = asyncio.run(scenario())
    assert answer == b"" or answer.startswith(b"HTTP/1.1 ")  # closed, or answered: not left waiting
