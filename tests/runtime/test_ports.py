"""A run's ports: drawn where outgoing connections never take them, given back when a worker goes down."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from p2pfl.hosting.ports import LOWEST, ephemeral_range, free_ports


def test_ports_are_drawn_below_the_ephemeral_range_distinct_and_free() -> None:
    ports = free_ports(50, "127.0.0.1", ephemeral=(32768, 60999))
    assert len(set(ports)) == 50
    assert all(LOWEST <= p < 32768 for p in ports)
    for p in ports:  # each one can be listened on now
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", p))
            s.listen()


class _Scripted(random.Random):
    """Draws the ports it is given, in order."""

    def __init__(self, draws: list[int]) -> None:
        super().__init__(0)
        self.draws = list(draws)

    def choice(self, seq):  # type: ignore[override]
        return self.draws.pop(0)


def _two_free_ports_below_the_range() -> tuple[int, int]:
    return tuple(free_ports(2, "127.0.0.1", ephemeral=(32768, 60999)))  # type: ignore[return-value]


def test_a_port_someone_listens_on_is_skipped() -> None:
    busy, other = _two_free_ports_below_the_range()
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a node's listener does
        taken.bind(("127.0.0.1", busy))
        taken.listen()
        assert free_ports(1, "127.0.0.1", ephemeral=(32768, 60999), rng=_Scripted([busy, other])) == [other]


def test_a_port_drawn_twice_is_taken_once() -> None:
    first, second = _two_free_ports_below_the_range()
    drawn = free_ports(2, "127.0.0.1", ephemeral=(32768, 60999), rng=_Scripted([first, first, second]))
    assert drawn == [first, second]


def test_without_room_below_the_range_the_kernel_picks() -> None:
    ports = free_ports(3, "127.0.0.1", ephemeral=(LOWEST + 2, 60999))
    assert len(set(ports)) == 3 and all(p > 0 for p in ports) and max(ports) >= LOWEST + 2


def test_as_many_ports_as_there_is_room_for_are_drawn_below_the_range() -> None:
    """10,000 nodes on this machine's 22,768 ports below its range: before, any count over a
    quarter of the room went to the kernel's range, where outgoing connections take ports too."""
    ports = free_ports(800, "127.0.0.1", ephemeral=(LOWEST + 1200, 60999))
    assert len(set(ports)) == 800 and all(LOWEST <= p < LOWEST + 1200 for p in ports)


def test_the_range_is_read_from_the_kernels_file(tmp_path: Path) -> None:
    f = tmp_path / "range"
    f.write_text("40000\t60999\n")
    assert ephemeral_range(f) == (40000, 60999)
    assert ephemeral_range(tmp_path / "missing") is None
    f.write_text("garbage")
    assert ephemeral_range(f) is None


@pytest.mark.skipif(ephemeral_range() is None, reason="no /proc/sys/net/ipv4/ip_local_port_range")
def test_by_default_the_kernels_range_is_avoided() -> None:
    low, high = ephemeral_range()  # type: ignore[misc]
    if low - LOWEST < 4 * 10:
        pytest.skip(f"this machine's ephemeral range starts at {low}: no room below it")
    assert all(not (low <= p <= high) for p in free_ports(10, "127.0.0.1"))


def test_a_cancelled_node_closes_its_listener_and_client_session(tmp_path: Path) -> None:
    """A worker whose node cannot listen goes down, cancelling the nodes beside it: each closes
    its sockets (the port is free again) and its HTTP client session."""
    import asyncio

    from .helpers import build_in_process, write_tiny

    nodes, _ = build_in_process(write_tiny(tmp_path, nodes=2, rounds=1, samples=40), tmp_path / "run",
                                overrides=("runtime.start_wait_s=60",))
    node = nodes[0]  # its peer never starts: it waits, listening

    async def cancel_while_waiting() -> None:
        task = asyncio.create_task(node.run())
        while getattr(node.parts.transport, "_session", None) is None:  # listening and its client open
            assert not task.done(), task.exception()
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_while_waiting())
    assert node.parts.transport._session.closed
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((node.config.host, node.config.port))
        s.listen()


def test_a_cancelled_coordinator_closes_its_listener(tmp_path: Path) -> None:
    """Its nodes never come: the coordinator waits for the first submission, listening; cancelled
    (its process going down), it frees its port as a node does."""
    import asyncio

    from .helpers import build_in_process, write_tiny

    _, coordinator = build_in_process(write_tiny(tmp_path, nodes=2, rounds=1, samples=40, algorithm="fedavg_global"),
                                      tmp_path / "run", overrides=("runtime.first_submission_wait_s=60",))
    assert coordinator is not None

    async def cancel_while_waiting() -> None:
        task = asyncio.create_task(coordinator.run())
        while True:  # until it answers a connection: listening
            assert not task.done(), task.exception()
            try:
                _, writer = await asyncio.open_connection(coordinator.config.host, coordinator.config.port)
            except OSError:
                await asyncio.sleep(0.01)
                continue
            writer.close()
            break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_while_waiting())
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((coordinator.config.host, coordinator.config.port))
        s.listen()
