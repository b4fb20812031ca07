"""What every carrier must do, run against each registered one (as torch.distributed.rpc runs
its suite against every agent): the same frames, bytes, refusals and waits over HTTP and in
memory. A new carrier adds its name to CARRIERS_UNDER_TEST and a `deliver` for raw frames."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import torch

from p2pfl.runtime.accounting import ByteCounter
from p2pfl.runtime.transport import (CARRIERS, ServerLimits, Transport, TransportSettings, build_transport,
                                     register_transport, transport_factory)
from p2pfl.runtime.transport.colocated import ColocatedEndpoint
from p2pfl.runtime.transport.http import Endpoint
from p2pfl.runtime.transport.loopback import InMemory, LoopbackCarrier
from p2pfl.hosting.ports import free_ports
from p2pfl.wire import NodeKey, Roster, WireLimits, encode

CARRIERS_UNDER_TEST = ("http", "loopback", "colocated")
SPEC = {"w": ((3, 2), "float32")}
W = torch.arange(6, dtype=torch.float32).reshape(3, 2)


class Pair:
    """Two started carriers a and b that know each other, and whatever b received."""

    def __init__(self, name: str, limits: ServerLimits = ServerLimits(), names: tuple[str, str] | None = None) -> None:
        self.name = name
        names = names or (name, name)  # the carriers of a and b
        self.keys = {"a": NodeKey.generate(), "b": NodeKey.generate()}
        self.roster = Roster({n: k.public_hex for n, k in self.keys.items()})
        ports = free_ports(2, "127.0.0.1")
        self.urls = {"a": f"http://127.0.0.1:{ports[0]}", "b": f"http://127.0.0.1:{ports[1]}"}
        self.ports = dict(zip("ab", ports))
        self.counters = {n: ByteCounter() for n in "ab"}
        self.inbox: list[Any] = []
        self.carriers: dict[str, Transport] = {}
        for n, carrier_name in zip("ab", names):
            other = "b" if n == "a" else "a"
            carrier = build_transport(carrier_name, TransportSettings(
                node_id=n, key=self.keys[n], roster=self.roster, urls={other: self.urls[other]},
                counter=self.counters[n], limits=WireLimits(max_message_bytes=2**20), retry_s=0.02,
                server_limits=limits, log=logging.getLogger(f"contract.{n}")))
            carrier.attach(expected_for=lambda kind, part: SPEC if kind in ("model", "stats") else None,
                           on_message=self.inbox.append, status=lambda n=n: {"id": n, "done": False},
                           meta_schema_for=lambda kind, part: None)
            self.carriers[n] = carrier

    async def __aenter__(self) -> Pair:
        for n, carrier in self.carriers.items():
            await carrier.start("127.0.0.1", self.ports[n])
        return self

    async def __aexit__(self, *exc: object) -> None:
        for carrier in self.carriers.values():
            await carrier.close()

    async def deliver(self, frame: bytes) -> int:
        """A raw frame to b's inbox, as a stranger on the medium would send it: its status."""
        if self.name == "http":
            async with aiohttp.ClientSession() as session:
                async with session.post(f"{self.urls['b']}/v1/inbox", data=frame) as resp:
                    return resp.status
        carrier = self.carriers["b"]
        assert isinstance(carrier, InMemory)  # loopback, and colocated's peers of its own process
        return carrier.receive(frame)[0]


def contract(test: Callable[[Pair], Awaitable[None]]) -> Any:
    @pytest.mark.parametrize("name", CARRIERS_UNDER_TEST)
    def run(name: str) -> None:
        async def body() -> None:
            async with Pair(name) as pair:
                await test(pair)
        asyncio.run(body())
    run.__name__ = test.__name__
    run.__doc__ = test.__doc__
    run.case = test  # type: ignore[attr-defined]
    return run


@contract
async def test_a_published_part_is_fetched_verified_and_counted_alike(pair: Pair) -> None:
    a, b = pair.carriers["a"], pair.carriers["b"]
    await a.publish(1, 1, {"full": {"w": W}}, {"n_train": 7})
    message = await b.fetch("a", "full", 1, timeout=5)
    assert message is not None and message.header.sender == "a" and message.header.version == 1
    assert torch.equal(message.torch_tensors()["w"], W) and message.header.meta["n_train"] == 7
    sent, received = pair.counters["a"].totals(), pair.counters["b"].totals()
    assert sent["bytes_sent"] == received["bytes_received"] == message.total_bytes
    assert sent["param_bytes_sent"] == received["param_bytes_received"] == W.numel() * 4


@contract
async def test_a_read_waits_for_its_version_and_gets_the_earliest_held_one(pair: Pair) -> None:
    a, b = pair.carriers["a"], pair.carriers["b"]
    waiting = asyncio.create_task(b.fetch("a", "full", 2, timeout=5))
    await asyncio.sleep(0.1)
    await a.publish(1, 1, {"full": {"w": W}}, {})
    await asyncio.sleep(0.05)
    assert not waiting.done()  # version 1 is not what it waits for
    await a.publish(2, 2, {"full": {"w": W + 2}}, {})
    await a.publish(3, 3, {"full": {"w": W + 3}}, {})
    got = await waiting
    assert got is not None and got.header.version in (2, 3)
    earliest = await b.fetch("a", "full", 2, timeout=5)
    assert earliest is not None and earliest.header.version == 2  # held, though 3 is newer


@contract
async def test_pushes_arrive_once_and_bad_ones_are_refused_and_logged(pair: Pair) -> None:
    a = pair.carriers["a"]
    assert await a.push("b", kind="stats", part="full", round_=1, version=1, tensors={"w": W}, meta={}, timeout=5)
    assert len(pair.inbox) == 1 and torch.equal(pair.inbox[0].torch_tensors()["w"], W)
    assert not await a.push("b", kind="model", part="full", round_=1, version=1, tensors={"w": torch.zeros(2, 2)},
                            meta={}, timeout=5)  # not the expected shape
    assert not await a.push("b", kind="chat", part="x", round_=1, version=1, tensors={}, meta={}, timeout=5)
    frame = encode(key=pair.keys["a"], kind="stats", sender="a", recipient="b", round=1, version=1, seq=10**18,
                   part="full", meta={}, tensors={"w": W})
    assert await pair.deliver(frame) == 202
    assert await pair.deliver(frame) == 409  # the same frame again: a replay
    forged = encode(key=NodeKey.generate(), kind="stats", sender="a", recipient="b", round=1, version=1,
                    seq=10**18 + 1, part="full", meta={}, tensors={"w": W})
    assert await pair.deliver(forged) == 401
    assert len(pair.inbox) == 2
    statuses = sorted(status for _, status, _ in pair.carriers["b"].rejections)
    assert statuses == [400, 401, 409, 422]  # wrong kind, forged, replayed, wrong shape


@contract
async def test_goodbye_ends_waiting_reads_and_later_ones(pair: Pair) -> None:
    a, b = pair.carriers["a"], pair.carriers["b"]
    waiting = asyncio.create_task(b.fetch("a", "full", 5, timeout=30))
    await asyncio.sleep(0.1)
    await a.say_goodbye(["b"], "failed in round 2", before_round=2)
    assert await asyncio.wait_for(waiting, 5) is None
    assert b.departed == {"a": "failed in round 2"}
    assert await b.fetch("a", "full", 1, timeout=30) is None
    await a.withdraw()  # what a failing node does next: its server stops holding the abandoned read


@contract
async def test_status_sit_out_withdraw_and_setup_parts(pair: Pair) -> None:
    a, b = pair.carriers["a"], pair.carriers["b"]
    assert await b.status_of("a") == {"id": "a", "done": False}
    assert await b.wait_until_up({"a"}, 5) == set()
    await a.sit_out(1)
    assert await asyncio.wait_for(b.fetch("a", "full", 1, timeout=30), 5) is None  # no wait for a sitting-out round
    await a.publish(1, 0, {"setup.index": {"w": W}}, {})
    setup = await b.fetch("a", "setup.index", 1, timeout=5)
    assert setup is not None and torch.equal(setup.torch_tensors()["w"], W)
    await a.publish(2, 0, {}, {}, addressed={"setup.reply": {"b": {"w": W + 1}}})
    reply = await b.fetch("a", "setup.reply", 2, timeout=5)
    assert reply is not None and torch.equal(reply.torch_tensors()["w"], W + 1)
    waiting = asyncio.create_task(b.fetch("a", "full", 9, timeout=30))
    await asyncio.sleep(0.1)
    await a.withdraw()
    assert await asyncio.wait_for(waiting, 5) is None


@contract
async def test_a_peer_that_is_not_up_is_silent_not_an_error(pair: Pair) -> None:
    a = pair.carriers["a"]
    await pair.carriers["b"].close()
    assert await a.status_of("b", timeout=0.5) is None
    assert await a.wait_until_up({"b"}, 0.3) == {"b"}
    assert await a.fetch("b", "full", 1, timeout=0.3) is None
    assert not await a.push("b", kind="stats", part="full", round_=1, version=1, tensors={"w": W}, meta={}, timeout=0.3)


def test_colocated_reaches_its_process_in_memory_and_everyone_else_over_http() -> None:
    async def body() -> None:
        async with Pair("colocated") as pair:  # both in this process and loop: no socket between them
            a, b = pair.carriers["a"], pair.carriers["b"]
            assert isinstance(a, ColocatedEndpoint) and isinstance(b, ColocatedEndpoint)
            await a.publish(1, 1, {"full": {"w": W}}, {})
            assert await b.fetch("a", "full", 1, timeout=5) is not None
            assert await b.push("a", kind="stats", part="full", round_=1, version=1, tensors={"w": W}, meta={}, timeout=5)
            assert await b.status_of("a") == {"id": "a", "done": False}
            assert not a.connections and not b.connections  # neither server accepted a connection
        # b a plain HTTP endpoint: as a node in another process, which colocated reaches over HTTP both ways.
        async with Pair("colocated", names=("colocated", "http")) as pair:
            a, b = pair.carriers["a"], pair.carriers["b"]
            assert isinstance(b, Endpoint) and not isinstance(b, InMemory)
            await b.publish(1, 1, {"full": {"w": W + 1}}, {})
            fetched = await a.fetch("b", "full", 1, timeout=5)
            assert fetched is not None and torch.equal(fetched.torch_tensors()["w"], W + 1)
            await a.publish(1, 1, {"full": {"w": W}}, {})
            assert await b.fetch("a", "full", 1, timeout=5) is not None
            assert a.connections and b.connections  # over sockets
            assert pair.counters["a"].totals()["bytes_received"] == pair.counters["b"].totals()["bytes_sent"]

    asyncio.run(body())


def test_carriers_are_found_by_name_and_unknown_ones_named() -> None:
    assert set(CARRIERS_UNDER_TEST) <= set(CARRIERS)
    with pytest.raises(ValueError, match="unknown transport 'pigeon'"):
        transport_factory("pigeon")
    with pytest.raises(ValueError, match="cannot load"):
        transport_factory("no_such_module:build")
    register_transport("loopback-again", lambda settings: LoopbackCarrier(settings))
    assert "loopback-again" in CARRIERS and transport_factory("loopback-again") is not None


def test_a_carrier_kind_with_an_address_format_of_its_own_is_read_everywhere_from_its_registration() -> None:
    """Registering a kind with its format is the one change: the launcher writes its nodes at that
    format's addresses, rosters and node configs read them; a federation (HTTP between members)
    refuses them, and an address no kind reads names the formats there are."""
    from types import SimpleNamespace

    from p2pfl.errors import ConfigError
    from p2pfl.runtime.federation.config import _url
    from p2pfl.runtime.peers import parse_peer
    from p2pfl.runtime.transport import addresses_of
    from p2pfl.runtime.transport.addresses import AddressFormat, parse_address
    from p2pfl.scenario.launcher import peer_info

    pigeon = AddressFormat(("pigeon",), tls_scheme="pigeons", default_ports={"pigeon": 7})
    register_transport("pigeon-post", lambda settings: LoopbackCarrier(settings), addresses=pigeon)
    assert addresses_of("pigeon-post") is pigeon and addresses_of("http").format("h", 1, tls=True) == "https://h:1"
    key = NodeKey.generate()
    scenario = SimpleNamespace(runtime=SimpleNamespace(transport="pigeon-post", tls=False))
    info = peer_info(scenario, "node-0", key, "10.0.0.5", 9100)  # type: ignore[arg-type]
    assert info.url == "pigeon://10.0.0.5:9100"
    assert parse_peer({"url": info.url, "public_key": key.public_hex}, "node").url == info.url
    assert parse_address("pigeon://10.0.0.5").endpoint == "10.0.0.5:7"
    with pytest.raises(ConfigError, match=r"expected an http\(s\)://host:port address"):
        _url(info.url, "federation.url")
    with pytest.raises(ConfigError, match=r"expected a carrier's address \(http\(s\)://host:port, loopback://"):
        parse_peer({"url": "carrier-pigeon://h:1", "public_key": key.public_hex}, "node")


def test_the_documented_carrier_example_passes_the_contract(tmp_path, monkeypatch) -> None:
    """docs/architecture.md's `DelayedLoopback`, verbatim: a new carrier in one module."""
    import re
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text()
    code = re.search(r"slow link for one process, in `my_carriers.py`:\n\n```python\n(.*?)```", text, re.S)
    assert code is not None
    (tmp_path / "my_carriers.py").write_text(code.group(1))
    monkeypatch.syspath_prepend(str(tmp_path))

    async def body() -> None:
        async with Pair("my_carriers:build") as pair:
            await test_a_published_part_is_fetched_verified_and_counted_alike.case(pair)

    asyncio.run(body())


class _Presence:
    """A carrier's presence half over given statuses (`PeerPresence`'s polling, no sockets)."""

    @staticmethod
    def make(status_of, local=lambda peer: False, readers=()):  # noqa: ANN001, ANN205
        from p2pfl.runtime.transport import presence

        class Fake(presence.PeerPresence):
            retry_s = 0.01

            async def status_of(self, peer: str, timeout: float = 2.0):  # noqa: ANN201
                return await status_of(peer, timeout)

            def answers_locally(self, peer: str) -> bool:
                return local(peer)

            def readers_so_far(self):  # noqa: ANN201
                return readers

        return Fake()


def test_nodes_of_one_process_poll_statuses_a_bounded_number_at_a_time(monkeypatch) -> None:
    """Every carrier on one event loop (a worker's nodes) shares one gate for status polls."""
    from p2pfl.runtime.transport import presence

    monkeypatch.setattr(presence, "STATUS_POLLS_PER_PROCESS", 3)
    in_flight, most = 0, 0

    async def status_of(peer: str, timeout: float = 2.0) -> dict:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.01)
        in_flight -= 1
        return {"id": peer}

    async def everyone() -> list:
        nodes = [_Presence.make(status_of) for _ in range(4)]
        return await asyncio.gather(*(n._statuses([f"p{i}" for i in range(8)], 1.0) for n in nodes))

    answers = asyncio.run(everyone())
    assert all(a == [{"id": f"p{i}"} for i in range(8)] for a in answers)
    assert most == 3  # 4 nodes x 8 polls (8 at once per node), at most 3 in the process


def test_a_status_read_in_this_process_does_not_wait_behind_polls_of_another(monkeypatch) -> None:
    """A worker's polls of a busy process hold the process's gate up to their timeout each; the
    statuses of the nodes beside it are read at once all the same."""
    from p2pfl.runtime.transport import presence

    monkeypatch.setattr(presence, "STATUS_POLLS_PER_PROCESS", 1)

    async def scenario() -> list:
        remote_answers = asyncio.Event()

        async def status_of(peer: str, timeout: float = 2.0) -> dict:
            if peer.startswith("remote"):
                await remote_answers.wait()
            return {"id": peer}

        node = _Presence.make(status_of, local=lambda peer: peer.startswith("beside"))
        remote = asyncio.ensure_future(node._statuses(["remote-1"], 1.0))
        await asyncio.sleep(0)  # the remote poll holds the process's one slot
        beside = await asyncio.wait_for(node._statuses(["beside-1", "beside-2"], 1.0), 10)
        remote_answers.set()
        return [beside, await remote]

    assert asyncio.run(scenario()) == [[{"id": "beside-1"}, {"id": "beside-2"}], [{"id": "remote-1"}]]


def test_a_neighbour_that_read_from_the_node_is_up_though_its_polls_go_unanswered() -> None:
    """A process too busy to answer a status poll in time still reads: its read shows it up."""
    async def scenario() -> tuple[set, int]:
        polls = 0

        async def status_of(peer: str, timeout: float = 2.0) -> None:
            nonlocal polls
            polls += 1
            return None  # nobody answers a poll

        node = _Presence.make(status_of, readers={"busy"})
        silent = await asyncio.wait_for(node.wait_until_up({"busy", "away"}, 0.5), 10)
        return silent, polls

    silent, polls = asyncio.run(scenario())
    assert silent == {"away"} and polls >= 1


def test_the_coordinators_connection_cap_grows_with_the_nodes_and_a_nodes_does_not(tmp_path) -> None:
    from p2pfl.runtime.peers import COORDINATOR_ID
    from p2pfl.runtime.transport import ServerLimits
    from p2pfl.scenario.carriers import server_limits
    from p2pfl.scenario.schema import load_scenario

    from .helpers import write_tiny

    sc = load_scenario(write_tiny(tmp_path, nodes=3))
    default = ServerLimits().max_connections
    # Every node long-polls the coordinator for its reply while the others still push.
    assert server_limits(sc, COORDINATOR_ID, 1000).max_connections >= 2000
    assert server_limits(sc, COORDINATOR_ID, 10).max_connections == default
    assert server_limits(sc, "node-0", 1000).max_connections == default


@contract
async def test_the_peer_directory_admits_and_refuses_a_member_on_every_carrier(pair: Pair) -> None:
    """`PeerDirectory` is the one writer of membership: what it admits the carrier verifies and the
    neighbour table asks or takes pushes from; what it refuses the carrier refuses by its cause,
    the table counts departed, and what the member pushed early is dropped."""
    from types import SimpleNamespace

    from p2pfl.runtime.node.neighbours import Neighbours
    from p2pfl.runtime.node.peer_directory import Member, PeerDirectory

    b = pair.carriers["b"]
    newcomer = NodeKey.generate()
    table = Neighbours(["a"], members=["a"])
    exchange = SimpleNamespace(outbound_only=False, intake=SimpleNamespace(early={("c", "full"): object()}))
    directory = PeerDirectory(b, table, exchange, lambda: 2, rounds=5)  # type: ignore[arg-type]

    def frame(seq: int) -> bytes:
        return encode(key=newcomer, kind="stats", sender="c", recipient="b", round=3, version=3, seq=seq,
                      part="full", meta={}, tensors={"w": W})

    assert await pair.deliver(frame(1)) != 202  # not a member yet
    directory.admit(Member("c", newcomer.public_hex))  # outbound only: it pushes, it is never read
    assert await pair.deliver(frame(2)) == 202 and "c" in table.push_only and "c" not in b.urls
    directory.admit(Member("c", newcomer.public_hex, url="http://127.0.0.1:9"))
    assert b.urls["c"] == "http://127.0.0.1:9" and table.asked == ("a",)  # one neighbour kept, and it has one
    directory.keep(2)
    directory.admit(Member("c", newcomer.public_hex, url="http://127.0.0.1:9"))
    assert table.asked == ("a", "c") and table.peer_rounds["c"] == frozenset({3, 4, 5})  # asked from round 3 on
    directory.refuse("c", "revoked", "revoked by the operator")
    assert await pair.deliver(frame(3)) != 202
    assert "revoked" in str(b.rejections.summary())
    assert "c" in table.departed and "c" not in table.push_only and "c" not in b.urls
    assert exchange.intake.early == {}
    directory.reachable(False)
    assert exchange.outbound_only
