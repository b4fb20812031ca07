"""Issue 63: what one member's key, or a head seen on the wire, can do to the others, tried on the
path an attacker uses (a real HTTP carrier on 127.0.0.1, or the node's own membership table)."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import aiohttp

from p2pfl.runtime.transport import ServerLimits
from p2pfl.wire import NodeKey, encode
from p2pfl.wire.envelope import head_length

from ..helpers import lone_node, model_frame
from ..test_hardening import _raw_post, _read_headers, _started


def test_replayed_push_heads_spend_nothing_of_their_signer(tmp_path: Path) -> None:
    """Before, the inbox took a token from the claimed sender's bucket (and counted the connection
    as its) before the replay and freshness checks: node-1's own signed reads got 429 after anyone
    replayed one of its push heads, fresh or an hour old. Now a replayed or stale head is refused
    (409) before anything is charged, and node-1 is served its whole burst."""
    peer_key = NodeKey.generate()
    node = lone_node(tmp_path, peer_key)
    node.transport.server_limits = ServerLimits(requests_per_s_per_peer=0.01, request_burst_per_peer=6.0)  # its push and five reads
    frame = model_frame(peer_key, node, seq=1)
    hour_old = encode(key=peer_key, kind="model", sender="node-1", recipient="node-0", round=1, version=1, seq=2,
                      part="body", meta={"n_train": 10}, timestamp=time.time() - 3600,
                      tensors={k: v.clone() for k, v in node.model.state_dict().items() if k.startswith("features")})
    out: dict[str, Any] = {}

    def head_of(whole: bytes) -> bytes:
        return whole[:head_length(whole[:9], len(whole))]

    async def scenario() -> None:
        base = await _started(node)
        try:
            async with aiohttp.ClientSession() as session:
                async with session.post(f"{base}/v1/inbox", data=frame) as resp:
                    out["pushed"] = resp.status  # not awaited by this node, but its seq is spent
                replays = [await _raw_post(node.config.port, head_of(f), len(f), timeout=4.0)
                           for f in [frame] * 10 + [hour_old] * 10]
                out["replays"] = sorted({a.split(b"\r\n")[0] for a, _ in replays})
                reads = []
                for seq in range(10, 15):
                    async with session.get(f"{base}/v1/parts/full?min_version=1",
                                           headers=_read_headers(peer_key, min_version=1, seq=seq)) as resp:
                        reads.append(resp.status)
                out["reads"] = reads
        finally:
            await node.transport.close()

    asyncio.run(scenario())
    assert out["pushed"] == 409
    assert out["replays"] == [b"HTTP/1.1 409 Conflict"]  # replayed (seq spent) or stale (an hour off the clock)
    assert out["reads"] == [200] * 5  # the whole burst is node-1's own
    reasons = {kind for (sender, status, kind) in node.transport.rejections.counts if sender == "node-1"}
    assert "rate_limited" not in reasons and {"replayed", "stale"} <= reasons


def _control(key: NodeKey, kind: str, round_: int, seq: int, statement: str | None, **meta: Any) -> bytes:
    """A goodbye or return frame of node-1 to node-0, carrying `statement` (None: none)."""
    if statement is not None:
        meta["statement"] = statement
    return encode(key=key, kind=kind, sender="node-1", recipient="node-0", round=round_, version=0, seq=seq,
                  part="", meta=meta, tensors={})


def test_goodbyes_are_bound_to_a_round_and_a_run_and_a_departed_member_returns_by_its_signed_word(
        tmp_path: Path) -> None:
    """Before, a goodbye carried no round (one signed "for round 12345" was taken, 202), departure
    was permanent (a member started again with --join was refused for the rest of the run: 410 on
    every push), and a departed member's signed reads were still served (200)."""
    from p2pfl.runtime.statements import ROUND_SLACK, sign_statement

    peer_key = NodeKey.generate()
    node = lone_node(tmp_path, peer_key)
    run = node.transport.run
    assert run  # the scenario's tag: statements of another run do not verify

    def said(event: int, in_run: str = run) -> str:
        return sign_statement(peer_key, in_run, "node-1", event).text

    out: dict[str, Any] = {}

    async def scenario() -> None:
        base = await _started(node)  # node-0 is in round 0: goodbyes for rounds 1 .. 1 + ROUND_SLACK are near
        try:
            async with aiohttp.ClientSession() as session:
                async def post(frame: bytes) -> int:
                    async with session.post(f"{base}/v1/inbox", data=frame) as resp:
                        return resp.status

                async def read(seq: int) -> int:
                    async with session.get(f"{base}/v1/parts/full?min_version=1",
                                           headers=_read_headers(peer_key, min_version=1, seq=seq)) as resp:
                        return resp.status

                out["far round"] = await post(_control(peer_key, "goodbye", 12345, 1, said(-12345), reason="x"))
                out["beyond slack"] = await post(_control(peer_key, "goodbye", 2 + ROUND_SLACK, 2,
                                                          said(-(2 + ROUND_SLACK)), reason="x"))
                out["other run"] = await post(_control(peer_key, "goodbye", 1, 3, said(-1, "another-run"), reason="x"))
                out["round mismatch"] = await post(_control(peer_key, "goodbye", 1, 4, said(-2), reason="x"))
                out["no statement"] = await post(_control(peer_key, "goodbye", 1, 5, None, reason="x"))
                out["departed before"] = dict(node.transport.departed)
                out["goodbye"] = await post(_control(peer_key, "goodbye", 1, 6, said(-1), reason="leaving"))
                out["read after goodbye"] = await read(7)
                out["push after goodbye"] = await post(model_frame(peer_key, node, seq=8))
                out["older return"] = await post(_control(peer_key, "back", 1, 9, said(1)))  # same round: follows it
                out["read after return"] = await read(10)
                out["departed after"] = dict(node.transport.departed)
        finally:
            await node.transport.close()

    asyncio.run(scenario())
    assert out["far round"] == 409 and out["beyond slack"] == 409  # statement_off_round
    assert out["other run"] == 403 and out["round mismatch"] == 403  # bad_statement
    assert out["no statement"] == 422  # bad_metadata: meta.statement missing
    assert out["departed before"] == {}
    assert out["goodbye"] == 202
    assert out["read after goodbye"] == 410 and out["push after goodbye"] == 410
    assert out["older return"] == 202 and out["read after return"] == 200 and out["departed after"] == {}
    kinds = {kind for (sender, status, kind) in node.transport.rejections.counts if sender == "node-1"}
    assert {"statement_off_round", "bad_statement", "bad_metadata"} <= kinds
    assert "node-1" in node.neighbours.heard_live and "node-1" not in node.neighbours.departed


def test_a_members_lie_in_its_part_is_neither_final_nor_relayed(tmp_path: Path) -> None:
    """Before, a victim that read the liar's part published {"node-3": -1, "node-2": -1, "node-1": 1}
    in its own signed parts for the news window, and the liar's later word changed nothing. Now the
    liar's claims about others verify under nobody's key: the victim probes them once and relays
    only what verified (the liar's word about itself)."""
    from p2pfl.runtime.node.intake import RoundChecks
    from p2pfl.runtime.statements import sign_statement
    from p2pfl.wire import open_message

    from ..helpers import build_in_process, write_tiny

    nodes, _ = build_in_process(write_tiny(tmp_path, nodes=4, rounds=2, samples=40), tmp_path / "run")
    victim, liar = nodes[0], nodes[1]
    run = victim.transport.run
    lie = {"node-2": sign_statement(liar.parts.key, run, "node-2", -1).text,  # signed by the liar, not by node-2
           "node-3": "-1:" + "00" * 64,
           "node-1": sign_statement(liar.parts.key, run, "node-1", 1).text}
    frame = model_frame(liar.parts.key, victim, part="full", meta={"n_train": 40, "members": lie})
    message = open_message(frame, roster=victim.transport.roster, recipient="node-0", replay=victim.transport.replay,
                           limits=victim.transport.limits, expected=victim.exchange.intake.expected("model", "full"))
    victim.exchange.intake.peer_model(message, RoundChecks(1))
    table = victim.neighbours
    assert not table.departed and table.probe_first == {"node-2", "node-3"} and not table.unreachable
    assert set(victim.exchange.round_meta(1).get("members", {})) == {"node-1"}  # only the verified word travels
    assert table.changes() == {"claimed_left": ["node-2", "node-3"]}
    table.answered(table.asked, [], 1)  # they answer: still neighbours
    assert {"node-2", "node-3"} <= set(table.asked)


def test_refused_parts_are_judged_by_the_conduct_rule_not_taken_for_silence(tmp_path: Path) -> None:
    """Before, a refused part counted as silence too: two refusals in a row had the neighbour
    "suspected" and replaced in round 2, before the documented rule (far over the bound or refused
    in most of at least DISTRUST_AFTER = 3 rounds). Now it is asked in rounds 1-3 and dropped in 3."""
    from p2pfl.runtime.peer_claims import DISTRUST_AFTER

    from ..helpers import build_in_process, run_in_process, write_tiny

    scenario = write_tiny(tmp_path, nodes=3, rounds=DISTRUST_AFTER, samples=40,
                          extra='\n[attack]\nkind = "sign-flip"\nnodes = [0]\nscale = 1000.0\n')
    nodes, coordinator = build_in_process(scenario, tmp_path / "run", ("runtime.update_bound=1",
                                                                       "runtime.update_refuse=100"))
    results, _, _ = run_in_process(nodes, coordinator)
    for result in results[1:]:
        rounds = result["rounds"]
        assert all("node-0" in r.get("peers_refused", {}) for r in rounds)  # asked, answered, refused each round
        assert not any("suspected" in r.get("neighbours", {}) for r in rounds)
        assert [r.get("neighbours", {}).get("distrusted") for r in rounds] == [None] * (DISTRUST_AFTER - 1) + [["node-0"]]


def test_revocation_lasts_a_restart_and_the_revoked_member_is_told_by_a_list_it_can_check(tmp_path: Path) -> None:
    """Before, a seed started afresh admitted a revoked member again (nothing kept the list), and a
    revoked member, refused with a line of text, trained alone to the end and exited 0. Now each
    member keeps the newest signed list on disk and reads it at start (or the file its operator
    names), and a refusal for revocation carries the federation's signed list: the revoked member
    checks it and stops (`stop_soon("revoked", ...)`); a list signed by anyone else changes nothing."""
    from aiohttp import web

    from p2pfl.hosting.ports import free_ports
    from p2pfl.runtime.federation.certificates import REVOKED, issue, revoke
    from p2pfl.runtime.federation.config import FederationConfig
    from p2pfl.runtime.federation.gossip import PATH, ExchangeFailed
    from p2pfl.runtime.federation.service import FederationMember

    fed, now = NodeKey.generate(), time.time()
    [port] = free_ports(1, "127.0.0.1")
    seed_url = f"http://127.0.0.1:{port}"

    def member(name: str, kept: Path | None = None) -> FederationMember:
        key = NodeKey.generate()
        issue(fed, name, key.public_hex, now=now - 60).save(tmp_path / f"{name}.cert")
        config = FederationConfig(fed.public_hex, tmp_path / f"{name}.cert", (seed_url,), f"http://10.0.0.{len(name)}:9000",
                                  revocations=kept)
        return FederationMember(config, key, expected_members=2, degree=None)

    class Stopped:
        def __init__(self) -> None:
            self.said: list[tuple[str, str]] = []

        def stop_soon(self, status: str, reason: str) -> None:
            self.said.append((status, reason))

    gamma = member("gamma")
    operator_list = tmp_path / "operator-revocations.toml"
    import tomli_w
    operator_list.write_text(tomli_w.dumps(revoke(fed, None, "gamma", now=now).to_dict()))
    seed = member("alpha", kept=operator_list)  # a seed started afresh, told where the operator's list is
    assert seed.directory.revocations.revoked.keys() == {"gamma"}
    forged = member("mallory")
    forged.directory.revocations = revoke(NodeKey.generate(), None, "gamma", now=now + 1)  # not the federation's
    node = Stopped()
    gamma.node = node
    out: dict[str, Any] = {}

    async def serve(handle: Any) -> web.AppRunner:
        async def exchange(request: web.Request) -> web.Response:
            status, body = await handle(await request.read())
            return web.Response(status=status, body=body)
        app = web.Application()
        app.router.add_post(PATH, exchange)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner

    async def scenario() -> None:
        for name, server in (("forged", forged), ("seed", seed)):
            runner = await serve(server.gossip.handle)
            try:
                await gamma.gossip.exchange(seed_url)
                out[name] = "admitted"
            except ExchangeFailed as failed:
                out[name] = str(failed)
            finally:
                await runner.cleanup()
                await gamma.gossip.close()
            out[f"stopped after {name}"] = list(node.said)

    asyncio.run(scenario())
    # mallory refuses gamma and sends a list the federation never signed: gamma goes on.
    assert out["forged"].startswith("refused this node: 403") and out["stopped after forged"] == []
    assert out["seed"].startswith("refused this node: 403") and REVOKED in out["seed"]
    [(status, reason)] = out["stopped after seed"]
    assert status == "revoked" and "gamma was revoked by the federation" in reason
    # The newest list is kept where the member reads it at start: a newer one replaces it on disk.
    seed.directory.offer_revocations(revoke(fed, seed.directory.revocations, "beta", now=now + 5))
    assert {"gamma", "beta"} <= set(operator_list.read_text().split('"')) | set(operator_list.read_text().split())
    restarted = member("alpha", kept=operator_list)
    assert restarted.directory.revocations.revoked.keys() == {"gamma", "beta"}
    assert gamma.config.revocations_file == tmp_path / "gamma.revocations.toml"  # default: beside the certificate
    assert "gamma" in gamma.config.revocations_file.read_text()  # gamma keeps the list that revoked it too


def test_a_hostile_seeds_thousands_of_records_are_read_whole_and_cost_a_bounded_few() -> None:
    """A genuine member as seed answers every exchange with 2000 records of its own (each signed
    later, each at another address: a fan-out and loops), or with 200 non-members. The joiner
    reads each answer whole (it took the first chunk only and refused 2 MB answers as not
    msgpack), keeps one record of the seed, at its newest address, notes at most 16 refusals an
    exchange and opens one connection. Across processes, with memory and time:
    `python benchmarks/hostile_seed.py` (docs/security.md)."""
    from aiohttp import web

    from p2pfl.runtime.federation.certificates import issue
    from p2pfl.runtime.federation.directory import REFUSED_PER_EXCHANGE, Directory
    from p2pfl.runtime.federation.gossip import PATH, Gossip
    from p2pfl.runtime.federation.gossip import encode as encode_exchange
    from p2pfl.runtime.federation.records import sign_record

    federation, seed_key, stranger = NodeKey.generate(), NodeKey.generate(), NodeKey.generate()
    now = time.time()
    certificate = issue(federation, "seed", seed_key.public_hex, now=now - 60)
    addresses = [f"http://10.9.{i // 250}.{i % 250 + 1}:9000" for i in range(2000)]
    itself = [sign_record(seed_key, certificate, url, now=now - 30 + i * 1e-3).to_dict() for i, url in enumerate(addresses)]
    strangers = []
    for i in range(200):
        key = NodeKey.generate()
        strangers.append(sign_record(key, issue(stranger, f"stranger-{i}", key.public_hex, now=now - 60), addresses[i],
                                     now=now - 30).to_dict())

    async def against(records: list[dict[str, Any]]) -> tuple[Gossip, set[Any], str]:
        peers: set[Any] = set()
        answer = encode_exchange({"records": records})

        async def exchange(request: web.Request) -> web.Response:
            peers.add(request.transport.get_extra_info("peername") if request.transport else None)
            await request.read()
            return web.Response(body=answer, content_type="application/msgpack")

        app = web.Application()
        app.router.add_post(PATH, exchange)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        key = NodeKey.generate()
        own = sign_record(key, issue(federation, "joiner", key.public_hex, now=now - 60), None, now=now)
        gossip = Gossip(Directory(federation.public_hex, own))
        try:
            await gossip.discover([url], wait_s=5.0)
            for _ in range(3):
                await gossip.exchange(url)
        finally:
            await gossip.close()
            await runner.cleanup()
        return gossip, peers, url

    async def both() -> None:
        gossip, peers, _ = await against([sign_record(seed_key, certificate, None, now=now - 40).to_dict(), *itself])
        assert set(gossip.directory.records) == {"seed"} and gossip.exchanges == 4
        assert gossip.directory.records["seed"].url == addresses[-1]  # its newest word, one record
        assert len(peers) == 1
        gossip, peers, _ = await against([itself[-1], *strangers])
        assert set(gossip.directory.records) == {"seed"} and gossip.exchanges == 4
        assert gossip.directory.refusals == 4 * REFUSED_PER_EXCHANGE and len(gossip.directory.refused) == REFUSED_PER_EXCHANGE
        assert len(peers) == 1

    asyncio.run(both())


def test_an_outbound_only_member_cannot_be_impersonated(tmp_path: Path) -> None:
    """omega reaches out and is reached by nobody: its parts come only as its own pushes. mallory,
    an admitted member, pushes as omega (its own key), moves omega's record to mallory's address
    (omega's certificate, mallory's signature) and offers a certificate for "omega" from a key
    that is not the federation's: each is refused on the node's real HTTP carrier, omega stays
    outbound only with its own key, nothing of mallory's is taken as omega's, and omega's own push is."""
    from p2pfl.runtime.federation.certificates import issue
    from p2pfl.runtime.federation.config import FederationConfig
    from p2pfl.runtime.federation.gossip import PATH
    from p2pfl.runtime.federation.gossip import decode as decode_exchange
    from p2pfl.runtime.federation.gossip import encode as encode_exchange
    from p2pfl.runtime.federation.records import sign_record
    from p2pfl.hosting.ports import free_ports
    from p2pfl.runtime.federation.service import FederationMember

    fed, now = NodeKey.generate(), time.time()
    node = lone_node(tmp_path, NodeKey.generate())
    own_key = NodeKey.load(tmp_path / "node-0.key")
    issue(fed, "node-0", own_key.public_hex, now=now - 60).save(tmp_path / "node-0.cert")
    base = f"http://127.0.0.1:{node.config.port}"
    member = FederationMember(FederationConfig(fed.public_hex, tmp_path / "node-0.cert", (), base), own_key,
                              expected_members=1, degree=None)
    omega_key, mallory_key = NodeKey.generate(), NodeKey.generate()
    omega_cert = issue(fed, "omega", omega_key.public_hex, now=now - 60)
    omega = sign_record(omega_key, omega_cert, None, now=now - 30)
    [closed] = free_ports(1, "127.0.0.1")
    mallory = sign_record(mallory_key, issue(fed, "mallory", mallory_key.public_hex, now=now - 60),
                          f"http://127.0.0.1:{closed}", now=now - 30)
    moved = dataclasses.replace(omega, url=f"http://127.0.0.1:{closed}", at=now - 10)
    moved = dataclasses.replace(moved, signature=mallory_key.sign(moved.signed_bytes()).hex())
    forged = sign_record(mallory_key, issue(NodeKey.generate(), "omega", mallory_key.public_hex, now=now - 60),
                         f"http://127.0.0.1:{closed}", now=now - 5)
    out: dict[str, Any] = {}

    async def scenario() -> None:
        await _started(node)
        member.directory.offer(omega)
        member.directory.offer(mallory)
        await member.start(node)
        try:
            async with aiohttp.ClientSession() as session:
                async with session.post(f"{base}/v1/inbox", data=model_frame(mallory_key, node, sender="omega")) as resp:
                    out["push as omega"] = resp.status
                for name, record in (("moved", moved), ("forged", forged)):
                    body = encode_exchange({"from": mallory.to_dict(), "records": [record.to_dict()]})
                    async with session.post(f"{base}{PATH}", data=body) as resp:
                        out[name] = (resp.status, decode_exchange(await resp.read()) if resp.status == 200 else None)
                out["omega after"] = member.directory.records["omega"]
                out["taken before"] = {k for k in node.exchange.intake.early if k[0] == "omega"}
                async with session.post(f"{base}/v1/inbox", data=model_frame(omega_key, node, sender="omega", seq=2)) as resp:
                    out["omega's push"] = resp.status
        finally:
            await member.stop()
            await node.transport.close()

    asyncio.run(scenario())
    assert out["push as omega"] == 401  # not signed by the key omega was admitted with
    assert out["moved"][0] == 200 and out["forged"][0] == 200  # mallory's own record stands; the rest is refused
    assert out["omega after"] == omega and "omega" not in node.transport.urls
    # both refused: the move (not signed by omega's key), then the certificate (not the federation's)
    assert member.directory.refusals == 2 and member.directory.refused["omega"][0] == "wrong_federation"
    assert out["taken before"] == set()
    assert out["omega's push"] in (200, 202)


def test_once_its_node_listens_a_members_exchanges_go_out_through_the_carrier_counted_and_bounded() -> None:
    """`PeerDirectory.caller`: the gossip's exchanges use the node's carrier, so their bytes are in
    the node's totals (control) and an answer over an exchange's bound is refused there as well."""
    import logging

    import pytest

    from aiohttp import web

    from p2pfl.hosting.ports import free_ports
    from p2pfl.runtime.accounting import CONTROL, ByteCounter
    from p2pfl.runtime.federation.certificates import issue
    from p2pfl.runtime.federation.directory import Directory
    from p2pfl.runtime.federation.gossip import MAX_EXCHANGE_BYTES, PATH, ExchangeFailed, Gossip
    from p2pfl.runtime.federation.gossip import encode as encode_exchange
    from p2pfl.runtime.federation.records import sign_record
    from p2pfl.runtime.transport import TransportSettings, build_transport
    from p2pfl.wire import Roster, WireLimits

    federation, seed_key, key = NodeKey.generate(), NodeKey.generate(), NodeKey.generate()
    now = time.time()
    seed = sign_record(seed_key, issue(federation, "seed", seed_key.public_hex, now=now - 60), "http://127.0.0.1:1",
                       now=now - 1)
    answers = [encode_exchange({"records": [seed.to_dict()]}), b"\x00" * (MAX_EXCHANGE_BYTES + 1)]

    async def body() -> None:
        async def exchange(request: web.Request) -> web.Response:
            await request.read()
            return web.Response(body=answers.pop(0), content_type="application/msgpack")

        app = web.Application(client_max_size=2**20)
        app.router.add_post(PATH, exchange)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        counter = ByteCounter()
        carrier = build_transport("http", TransportSettings(
            node_id="joiner", key=key, roster=Roster({}), urls={}, counter=counter,
            limits=WireLimits(max_message_bytes=2**20), log=logging.getLogger("test.carrier")))
        carrier.attach(expected_for=lambda kind, part: None, on_message=lambda m: None,
                       status=lambda: {"id": "joiner"}, meta_schema_for=lambda kind, part: None)
        await carrier.start("127.0.0.1", free_ports(1, "127.0.0.1")[0])
        own = sign_record(key, issue(federation, "joiner", key.public_hex, now=now - 60), None, now=now)
        gossip = Gossip(Directory(federation.public_hex, own))
        gossip.call = carrier.call  # as FederationMember.start sets it from node.peers.caller()
        try:
            await gossip.exchange(url)
            assert set(gossip.directory.records) == {"seed"} and gossip.session is None  # no session of its own
            totals = counter.totals()
            sent, got = totals["bytes_sent"], totals["bytes_received"]
            assert sent > 0 and got >= len(encode_exchange({"records": [seed.to_dict()]}))
            with pytest.raises(ExchangeFailed, match="refuses"):
                await gossip.exchange(url)
            assert counter.totals()["bytes_sent"] > sent  # the refused exchange's request is counted too
            assert CONTROL in str(counter.rounds[0].sent)
        finally:
            await gossip.close()
            await carrier.close()
            await runner.cleanup()

    asyncio.run(body())
