"""A live node's HTTP surface against a hostile client: every answer is a 4xx with a reason,
reads are signed, nothing unauthenticated is buffered, and connections are bounded.

Each test starts node-0's endpoint in this process (its one peer, node-1, never runs) and
talks to it over 127.0.0.1 with raw sockets or aiohttp, bounded in count and time.
"""

from __future__ import annotations

import asyncio
import gzip
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import torch

from p2pfl.models import part_state
from p2pfl.runtime.node import Node
from p2pfl.runtime.devices import host_snapshot
from p2pfl.runtime.strategy import Fetch
from p2pfl.runtime.transport import ServerLimits
from p2pfl.wire import NodeKey, encode
from p2pfl.wire.request import AUTH_HEADER, ReadRequest, request_for, sign_request
from p2pfl.runtime.node.intake import RoundChecks
from p2pfl.runtime.node.round import Round

from .helpers import lone_node, model_frame, recording_push, silent_peer


def _serving(tmp_path: Path, peer_key: NodeKey, limits: ServerLimits | None = None) -> Node:
    node = lone_node(tmp_path, peer_key)
    if limits is not None:
        node.transport.server_limits = limits
    return node


async def _started(node: Node) -> str:
    await node.transport.start(node.config.host, node.config.port)
    await node.transport.publish(1, 1, {"full": host_snapshot(part_state(node.model, "full"))}, {"n_train": 10})
    return f"http://127.0.0.1:{node.config.port}"


def _read_headers(key: NodeKey, *, requester: str = "node-1", target: str = "node-0", part: str = "full",
                  min_version: int = 0, seq: int = 1) -> dict[str, str]:
    return {AUTH_HEADER: request_for(key, requester, target, part, min_version, seq)}


def test_reads_must_be_signed_by_a_roster_member(tmp_path: Path) -> None:
    peer_key, stranger = NodeKey.generate(), NodeKey.generate()
    node = _serving(tmp_path, peer_key)
    statuses: dict[str, int] = {}

    async def scenario() -> None:
        base = await _started(node)
        url = f"{base}/v1/parts/full?min_version=0&wait=0"
        cases: dict[str, dict[str, str]] = {
            "unsigned": {},
            "old style (requester in the query)": {},
            "forged": _read_headers(stranger, seq=2),
            "unknown requester": {AUTH_HEADER: sign_request(stranger, ReadRequest("mallory", "node-0", "full", 0, time.time(), 3))},
            "another target": _read_headers(peer_key, target="node-7", seq=4),
            "another part": _read_headers(peer_key, part="body", seq=5),
            "stale": {AUTH_HEADER: sign_request(peer_key, ReadRequest("node-1", "node-0", "full", 0, time.time() - 10_000, 6))},
            "garbage": {AUTH_HEADER: "zz.zz"},
            "valid": _read_headers(peer_key, seq=7),
        }
        try:
            async with aiohttp.ClientSession() as session:
                for name, headers in cases.items():
                    target = url + ("&requester=node-1" if "query" in name else "")
                    async with session.get(target, headers=headers) as resp:
                        statuses[name] = resp.status
                        if name == "valid":
                            assert len(await resp.read()) > 100_000
                async with session.get(url, headers=cases["valid"]) as resp:
                    statuses["replayed"] = resp.status
                async with session.get(f"{base}/v1/status") as resp:
                    statuses["status"] = resp.status
                    assert set(await resp.json()) == {"id", "round", "done"}
        finally:
            await node.transport.close()

    asyncio.run(scenario())
    assert statuses == {
        "unsigned": 401, "old style (requester in the query)": 401, "forged": 401, "unknown requester": 403,
        "another target": 403, "another part": 400, "stale": 409, "garbage": 400, "valid": 200, "replayed": 409,
        "status": 200,
    }
    # Nothing was sent but the one signed answer.
    assert node.parts.counter.totals()["bytes_sent"] > 0
    assert sum(t.messages for rb in node.parts.counter.rounds.values() for t in rb.sent.values()) == 1


@pytest.mark.parametrize("query", ["wait=nan", "wait=inf", "wait=-1", "wait=601", "min_version=-1",
                                   f"min_version={2**63}", "min_version=1.5", "wait=abc"])
def test_query_parameters_are_finite_and_bounded(tmp_path: Path, query: str) -> None:
    peer_key = NodeKey.generate()
    node = _serving(tmp_path, peer_key)

    async def scenario() -> tuple[int, str]:
        base = await _started(node)
        try:
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{base}/v1/parts/full?{query}", headers=_read_headers(peer_key)) as resp:
                    return resp.status, await resp.text()
        finally:
            await node.transport.close()

    status, text = asyncio.run(scenario())
    assert status == 400 and ("wait" in text or "min_version" in text)


def test_compressed_and_lengthless_bodies_are_refused(tmp_path: Path) -> None:
    peer_key = NodeKey.generate()
    node = _serving(tmp_path, peer_key)

    async def scenario() -> list[int]:
        base = await _started(node)
        frame = model_frame(peer_key, node, seq=3)
        try:
            async with aiohttp.ClientSession() as session:
                out = []
                for body, headers in ((b"not gzip at all", {"Content-Encoding": "gzip"}),
                                      (gzip.compress(frame), {"Content-Encoding": "gzip"}),
                                      (frame, {"Content-Encoding": "br"})):
                    async with session.post(f"{base}/v1/inbox", data=body, headers=headers) as resp:
                        out.append(resp.status)

                async def chunks():
                    yield frame[:100]
                    yield frame[100:]

                async with session.post(f"{base}/v1/inbox", data=chunks()) as resp:  # chunked: no length
                    out.append(resp.status)
                return out
        finally:
            await node.transport.close()

    assert asyncio.run(scenario()) == [415, 415, 415, 411]


async def _raw_post(port: int, head: bytes, content_length: int, timeout: float) -> tuple[bytes, float]:
    """POST `head` announcing `content_length` bytes, send nothing more, and read what comes back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.perf_counter()
    writer.write(b"POST /v1/inbox HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-p2pfl\r\n"
                 + f"Content-Length: {content_length}\r\n\r\n".encode() + head)
    await writer.drain()
    try:
        answer = await asyncio.wait_for(reader.read(4096), timeout)
    finally:
        writer.close()
    return answer, time.perf_counter() - started


def test_an_unauthenticated_sender_is_refused_before_its_body_is_read(tmp_path: Path) -> None:
    peer_key, stranger = NodeKey.generate(), NodeKey.generate()
    node = _serving(tmp_path, peer_key, ServerLimits(read_timeout_s=5.0))
    big = {k: torch.zeros_like(v) for k, v in part_state(node.model, "body").items()}
    frames = {
        "forged": encode(key=stranger, kind="model", sender="node-1", recipient="node-0", round=1, version=1, seq=1,
                         part="body", meta={"n_train": 1}, tensors=big),
        "unknown": encode(key=stranger, kind="model", sender="mallory", recipient="node-0", round=1, version=1,
                          seq=1, part="body", meta={"n_train": 1}, tensors=big),
        "wrong recipient": encode(key=peer_key, kind="model", sender="node-1", recipient="node-9", round=1, version=1,
                                  seq=1, part="body", meta={"n_train": 1}, tensors=big),
        "bad metadata": encode(key=peer_key, kind="model", sender="node-1", recipient="node-0", round=1, version=1,
                               seq=2, part="body", meta={"n_train": "lots"}, tensors=big),
    }

    async def scenario() -> dict[str, tuple[bytes, float]]:
        await _started(node)
        try:
            out = {}
            for name, frame in frames.items():
                head = frame[:1024]  # prefix, header, signature and padding are well within 1 KiB
                out[name] = await _raw_post(node.config.port, head, len(frame) + 3 * 2**20 // 2, timeout=4.0)
            return out
        finally:
            await node.transport.close()

    answers = asyncio.run(scenario())
    for name, (answer, seconds) in answers.items():
        # Answered from the head alone, at once, while 1.5 MiB of announced body never came.
        assert seconds < 2.0, name
    assert answers["forged"][0].startswith(b"HTTP/1.1 401")
    assert answers["unknown"][0].startswith(b"HTTP/1.1 403")
    assert answers["wrong recipient"][0].startswith(b"HTTP/1.1 403")
    assert answers["bad metadata"][0].startswith(b"HTTP/1.1 422") and b"meta.n_train" in answers["bad metadata"][0]


def test_slow_and_silent_connections_are_closed_and_connections_are_capped(tmp_path: Path) -> None:
    peer_key = NodeKey.generate()
    node = _serving(tmp_path, peer_key, ServerLimits(read_timeout_s=1.5, max_connections=4))

    async def scenario() -> dict[str, Any]:
        base = await _started(node)
        out: dict[str, Any] = {}
        try:
            # No headers at all: closed after read_timeout_s.
            reader, writer = await asyncio.open_connection("127.0.0.1", node.config.port)
            out["silent"] = await asyncio.wait_for(reader.read(), 6.0)
            writer.close()
            # Headers, then a body that stops: 408.
            frame = model_frame(peer_key, node, seq=5)
            out["stalled"], _ = await _raw_post(node.config.port, frame[:1024], len(frame), timeout=6.0)
            # Over the connection cap: the fifth is closed at once; the first four stay usable.
            held = [await asyncio.open_connection("127.0.0.1", node.config.port) for _ in range(4)]
            reader, writer = await asyncio.open_connection("127.0.0.1", node.config.port)
            out["over cap"] = await asyncio.wait_for(reader.read(), 3.0)
            writer.close()
            for _, w in held:
                w.close()
            await asyncio.sleep(0.2)
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{base}/v1/status") as resp:
                    out["after"] = resp.status
        finally:
            await node.transport.close()
        return out

    out = asyncio.run(scenario())
    assert out["silent"] == b""
    assert out["stalled"].startswith(b"HTTP/1.1 408")
    assert out["over cap"] == b""
    assert out["after"] == 200
    kinds = {kind for (_, _, kind) in node.transport.rejections.counts}
    assert {"header_timeout", "read_timeout", "too_many_connections"} <= kinds


def test_concurrent_reads_per_peer_are_capped(tmp_path: Path) -> None:
    peer_key = NodeKey.generate()
    node = _serving(tmp_path, peer_key, ServerLimits(max_requests_per_peer=3))

    async def scenario() -> list[int]:
        base = await _started(node)
        try:
            async with aiohttp.ClientSession() as session:
                async def poll(seq: int) -> int:
                    # version 5 is never published: each poll waits its full second
                    async with session.get(f"{base}/v1/parts/full?min_version=5&wait=1",
                                           headers=_read_headers(peer_key, min_version=5, seq=seq)) as resp:
                        await resp.read()
                        return resp.status

                return list(await asyncio.gather(*(poll(s) for s in range(10, 16))))
        finally:
            await node.transport.close()

    statuses = asyncio.run(scenario())
    assert sorted(statuses) == [200, 200, 200, 429, 429, 429]


def test_the_rejection_record_is_bounded_and_marks_unverified_senders(tmp_path: Path) -> None:
    peer_key, stranger = NodeKey.generate(), NodeKey.generate()
    node = _serving(tmp_path, peer_key)
    hostile = "m" * 60_000

    async def scenario() -> None:
        base = await _started(node)
        try:
            async with aiohttp.ClientSession() as session:
                for i in range(300):
                    frame = encode(key=stranger, kind="model", sender=hostile, recipient="node-0", round=1, version=1,
                                   seq=i, part="body", meta={}, tensors={})
                    async with session.post(f"{base}/v1/inbox", data=frame) as resp:
                        assert resp.status == 400 or resp.status == 403
        finally:
            await node.transport.close()

    asyncio.run(scenario())
    record = node.transport.rejections.summary()
    assert record["total"] == 300
    assert len(record["recent"]) <= 100
    assert all(len(r["reason"]) <= 300 for r in record["recent"])
    assert all(r["sender"] == "?" for r in record["recent"])  # the claimed name was never verified
    assert len(record["counts"]) <= 3


def test_pushes_are_taken_only_when_awaited_and_within_one_round(tmp_path: Path) -> None:
    peer_key = NodeKey.generate()
    node = _serving(tmp_path, peer_key)
    statuses: dict[str, int] = {}
    arrived: list = []

    checks: dict[int, RoundChecks] = {}

    async def scenario() -> None:
        base = await _started(node)
        try:
            async with silent_peer(node), aiohttp.ClientSession() as session:
                push = recording_push(session, base, statuses)
                checks[3] = RoundChecks(3)
                await push("not awaited", model_frame(peer_key, node, seq=1, version=3))
                gathering = asyncio.create_task(node.exchange.gather([Fetch("node-1", "body")], 3, checks[3]))
                await asyncio.sleep(0.2)
                await push("far future", model_frame(peer_key, node, seq=2, version=2**62))
                await push("old", model_frame(peer_key, node, seq=3, version=1))
                await push("other part", model_frame(peer_key, node, seq=4, version=3, part="head"))
                await push("awaited", model_frame(peer_key, node, seq=5, version=4))
                arrived.extend(await gathering)
                await push("after", model_frame(peer_key, node, seq=6, version=3))
        finally:
            await node.transport.close()

    asyncio.run(scenario())
    assert statuses == {"not awaited": 409, "far future": 409, "old": 409, "other part": 409, "awaited": 202,
                        "after": 409}
    assert [(m.sender, m.version) for m in arrived] == [("node-1", 4)]


def test_a_non_finite_aggregate_is_refused_and_the_node_goes_on(tmp_path: Path) -> None:
    from .helpers import build_in_process, run_in_process, write_tiny

    nodes, _ = build_in_process(write_tiny(tmp_path, nodes=2, rounds=2, samples=40), tmp_path / "run")
    victim = nodes[0]
    aggregate = victim.strategy.aggregate

    def overflowing(ctx: Any, arrived: list) -> None:
        aggregate(ctx, arrived)
        if ctx.round == 1:  # finite peers, overflowing sum: what 3e38-valued pushes did
            with torch.no_grad():
                next(iter(ctx.model.parameters())).fill_(3e38).mul_(10)

    victim.strategy.aggregate = overflowing  # type: ignore[method-assign]
    results, _, _ = run_in_process(nodes, None)
    result = results[0]
    assert result["status"] == "ok"
    first, second = result["rounds"]
    assert "non-finite" in first["aggregate_refused"] and "aggregate_refused" not in second
    # The model from before the aggregate was kept: the trained one, with its accuracy and finite loss.
    assert first["test_acc_aggregated"] == first["test_acc"]
    assert np.isfinite(second["train_loss"])
    assert all(bool(torch.isfinite(v).all()) for v in victim.model.state_dict().values())


def test_an_aggregate_whose_sum_overflows_with_every_value_finite_is_kept(tmp_path: Path) -> None:
    """The screen sums each tensor in its own precision: a sum past float32's range with every
    value finite is measured per element and kept; one NaN or Inf anywhere is refused."""
    from .helpers import build_in_process, write_tiny

    [node, _] = build_in_process(write_tiny(tmp_path, nodes=2, rounds=1, samples=40), tmp_path / "run")[0]
    before = {k: v.clone() for k, v in node.model.state_dict().items()}
    weight = next(iter(node.model.parameters()))
    with torch.no_grad():
        weight.view(-1)[:2] = 3e38  # each finite, their float32 sum inf
    assert torch.isinf(weight.sum()) and Round(node.kit, 1).refuse_non_finite(before) is None
    assert float(weight.detach().view(-1)[0]) == pytest.approx(3e38)  # kept as aggregated
    for bad in (float("nan"), float("inf"), -float("inf")):
        with torch.no_grad():
            weight.view(-1)[5] = bad
        assert "non-finite values in 1 tensors" in (Round(node.kit, 1).refuse_non_finite(before) or "")
        assert all(torch.equal(v, before[k]) for k, v in node.model.state_dict().items())  # the model from before
        with torch.no_grad():
            weight.view(-1)[:2] = 3e38


def test_a_round_in_which_a_node_received_nothing_is_flagged(tmp_path: Path) -> None:
    """Review finding 6: Under a connection flood a node got no model in a round and the run still said ok: now
    the node ends "degraded", names the rounds, and the run's summary warns."""
    from p2pfl.scenario.results import degraded_warning

    from .helpers import build_in_process, run_in_process, write_tiny

    nodes, _ = build_in_process(write_tiny(tmp_path, nodes=2, rounds=3, samples=40, timeout=3.0), tmp_path / "run")
    victim = nodes[0]
    fetch = victim.transport.fetch

    async def locked_out_in_round_2(peer: str, part: str, round_: int, *args: Any, **kwargs: Any) -> Any:
        if round_ == 2:  # what a full connection cap does to every new connection
            return None
        return await fetch(peer, part, round_, *args, **kwargs)

    victim.transport.fetch = locked_out_in_round_2  # type: ignore[method-assign]
    results, _, _ = run_in_process(nodes, None)
    assert (results[0]["status"], results[0]["rounds_alone"]) == ("degraded", [2])
    assert (results[1]["status"], results[1]["rounds_alone"]) == ("ok", [])
    warning = degraded_warning({"node-0": [2]})
    assert warning is not None and "node-0 in rounds 2" in warning and "degraded" in warning


def test_malformed_requests_log_one_rate_limited_line_not_a_traceback_each(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review finding 8: 500 requests with a header line over 8 190 bytes wrote 500 tracebacks (354 KiB)."""
    import logging

    from p2pfl.logs import LIBRARY_LINES_PER_WINDOW, OneLineRateLimited, limit_library_logs

    limit_library_logs()
    # The filter is installed once per process: an earlier test of this worker may have used part
    # of its window, and 60 requests on a loaded machine may outlast one. One window, from now.
    [limiter] = [f for f in logging.getLogger("aiohttp.server").filters if isinstance(f, OneLineRateLimited)]
    monkeypatch.setattr(limiter, "clock", lambda: 0.0)
    monkeypatch.setattr(limiter, "window_start", 0.0)
    monkeypatch.setattr(limiter, "in_window", 0)
    monkeypatch.setattr(limiter, "suppressed", 0)
    node = _serving(tmp_path, NodeKey.generate())
    answers: list[bytes] = []

    async def scenario() -> None:
        await _started(node)
        try:
            for _ in range(60):
                reader, writer = await asyncio.open_connection("127.0.0.1", node.config.port)
                writer.write(b"GET /v1/status HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 9000 + b"\r\n\r\n")
                await writer.drain()
                answers.append(await asyncio.wait_for(reader.read(200), 10))
                writer.close()
        finally:
            await node.transport.close()

    with caplog.at_level(logging.DEBUG):
        asyncio.run(scenario())
    assert all(a.startswith((b"HTTP/1.0 400", b"HTTP/1.1 400")) or a == b"" for a in answers) and any(answers)
    library = [r for r in caplog.records if r.name.startswith(("aiohttp", "asyncio"))]
    assert len([r for r in library if r.name == "aiohttp.server"]) == LIBRARY_LINES_PER_WINDOW
    assert not any(r.exc_info or r.exc_text for r in library)
    assert "Traceback" not in caplog.text


def test_the_one_line_filter_counts_what_it_drops() -> None:
    import logging

    from p2pfl.logs import OneLineRateLimited

    now = [0.0]
    limiter = OneLineRateLimited(lines=2, window_s=10.0, clock=lambda: now[0])

    def record(msg: str) -> logging.LogRecord:
        try:
            raise OSError(24, "Too many open files")
        except OSError:
            import sys
            return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, sys.exc_info())

    kept = [r for r in (record(f"accept failed {i}") for i in range(5)) if limiter.filter(r)]
    assert [r.getMessage() for r in kept] == ["accept failed 0: OSError: [Errno 24] Too many open files",
                                             "accept failed 1: OSError: [Errno 24] Too many open files"]
    now[0] = 11.0
    later = record("accept failed 5")
    assert limiter.filter(later) and later.getMessage().endswith("(3 more like it were not logged)")


def test_a_replayed_head_and_uploads_past_the_body_budget_are_refused_before_their_bodies(
        tmp_path: Path) -> None:
    """Review finding 4: Before, the inbox buffered every authenticated body whole before the replay check, and
    nothing bounded the bodies buffered at once: 8 uploads of 64 MiB held a byte short cost
    +508 MiB, also with a head replayed from a frame the node had accepted."""
    from p2pfl.wire.envelope import head_length

    peer_key = NodeKey.generate()
    node = _serving(tmp_path, peer_key, ServerLimits(read_timeout_s=5.0))
    frame = model_frame(peer_key, node, seq=1)
    body_bytes = len(frame) - head_length(frame[:9], len(frame))
    node.transport.server_limits = ServerLimits(read_timeout_s=1.5, max_buffered_body_bytes=3 * body_bytes)
    held: list[int] = []

    async def scenario() -> dict[str, Any]:
        base = await _started(node)
        out: dict[str, Any] = {}
        try:
            async with aiohttp.ClientSession() as session:
                async with session.post(f"{base}/v1/inbox", data=frame) as resp:  # not awaited: 409, seq 1 spent
                    out["first"] = resp.status
            head = frame[:len(frame) - body_bytes]
            out["replayed"] = await _raw_post(node.config.port, head, len(frame), timeout=4.0)
            # Five fresh signed uploads, each holding its body back: three fit the budget.
            fresh = [model_frame(peer_key, node, seq=10 + i) for i in range(5)]
            waits = [asyncio.create_task(_raw_post(node.config.port, f[:len(f) - body_bytes], len(f), timeout=4.0))
                     for f in fresh]
            await asyncio.sleep(0.5)
            held.append(node.transport.buffered_body_bytes)
            out["uploads"] = await asyncio.gather(*waits)
            held.append(node.transport.buffered_body_bytes)
        finally:
            await node.transport.close()
        return out

    out = asyncio.run(scenario())
    assert out["first"] == 409
    answer, seconds = out["replayed"]
    assert answer.startswith(b"HTTP/1.1 409") and b"was already accepted" in answer and seconds < 1.0
    statuses = sorted(a[:12] for a, _ in out["uploads"])
    assert statuses == [b"HTTP/1.1 408"] * 3 + [b"HTTP/1.1 429"] * 2  # three waited for their bodies, two refused
    assert held == [3 * body_bytes, 0]


def _stalled_read(port: int, key: NodeKey, seq: int) -> socket.socket:
    """A signed read of node-0's "full" part on a socket with a tiny receive buffer, never read from."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    headers = _read_headers(key, min_version=1, seq=seq)
    sock.sendall(("GET /v1/parts/full?min_version=1 HTTP/1.1\r\nHost: x\r\n" + "".join(
        f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n").encode())
    return sock


def test_a_reader_that_never_reads_is_cut_off_and_holds_its_place_until_then(tmp_path: Path) -> None:
    """Review finding 5: Before, a read counted against the per-peer cap only while it waited for a version, not
    while its answer was written, and writes had no timeout: 40 signed reads of a 13 MB model by
    a client that never read held +430 MiB for as long as it liked."""
    import socket

    peer_key = NodeKey.generate()
    node = _serving(tmp_path, peer_key, ServerLimits(max_requests_per_peer=2, write_timeout_s=1.5))
    big = {"w": np.zeros(8 * 2**20, np.float32)}  # 32 MiB: far more than the socket buffers take
    seen: dict[str, Any] = {}

    def stalled_read(seq: int) -> socket.socket:
        return _stalled_read(node.config.port, peer_key, seq)

    async def scenario() -> None:
        await node.transport.start(node.config.host, node.config.port)
        await node.transport.publish(1, 1, {"full": big}, {"n_train": 10})
        base = f"http://127.0.0.1:{node.config.port}"
        try:
            stalled = [await asyncio.to_thread(stalled_read, seq) for seq in (1, 2)]
            await asyncio.sleep(0.5)
            seen["held"] = node.transport._reads_by_peer.get("node-1")
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{base}/v1/parts/full?min_version=1",
                                       headers=_read_headers(peer_key, min_version=1, seq=3)) as resp:
                    seen["third while two are stuck"] = resp.status
            await asyncio.sleep(2.0)  # past the write timeout
            seen["held after timeout"] = node.transport._reads_by_peer.get("node-1")
            async with aiohttp.ClientSession() as session:
                async with session.get(f"{base}/v1/parts/full?min_version=1",
                                       headers=_read_headers(peer_key, min_version=1, seq=4)) as resp:
                    seen["after"] = (resp.status, len(await resp.read()))
            for sock in stalled:
                sock.close()
            seen["sent"] = node.transport.counter.totals()["bytes_sent"]
        finally:
            await node.transport.close()

    asyncio.run(scenario())
    assert seen["held"] == 2 and seen["third while two are stuck"] == 429
    assert seen["held after timeout"] == 0
    status, size = seen["after"]
    assert status == 200 and size > 32 * 2**20
    assert seen["sent"] == size  # the two cut-off answers are not counted as sent
    timeouts = [r for r in node.transport.rejections if r[1] == 408 and "write timeout" in r[2]]
    assert len(timeouts) == 2


def test_a_stalled_reader_is_aborted_and_its_buffered_answer_dropped(tmp_path: Path) -> None:
    """Review finding 3 of issue 48: Before, the write timeout closed the connection gracefully: asyncio then waits for the
    write buffer to drain, which a reader that never reads never lets happen, so the socket and
    its buffered copy of the model stayed (three waves of 16 stalled reads of a 13 MB model:
    468 -> 983 MiB, never returned). Aborted, the connection is gone at the timeout."""
    import socket

    peer_key = NodeKey.generate()
    node = _serving(tmp_path, peer_key, ServerLimits(max_requests_per_peer=4, write_timeout_s=1.0))
    big = {"w": np.zeros(8 * 2**20, np.float32)}
    seen: dict[str, Any] = {}

    def stalled_read(seq: int) -> socket.socket:
        return _stalled_read(node.config.port, peer_key, seq)

    async def scenario() -> None:
        await node.transport.start(node.config.host, node.config.port)
        await node.transport.publish(1, 1, {"full": big}, {"n_train": 10})
        stalled = []
        try:
            for wave in range(3):
                stalled += [await asyncio.to_thread(stalled_read, 10 * wave + i) for i in range(4)]
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 10.0  # the write timeout is 1 s: far inside this
                while node.transport.connections and loop.time() < deadline:
                    await asyncio.sleep(0.05)
                seen[wave] = (len(node.transport.connections), node.transport._reads_by_peer.get("node-1"))
        finally:
            for sock in stalled:  # open all along: the server let go of them, not the readers
                sock.close()
            await node.transport.close()

    asyncio.run(scenario())
    assert seen == {0: (0, 0), 1: (0, 0), 2: (0, 0)}


def test_one_member_cannot_take_the_push_budget_nor_reuse_a_seq(tmp_path: Path) -> None:
    """Review findings 1 and 5 of issue 48: Before: a roster member's signed heads whose bodies never came filled the shared push
    budget at no memory cost (the other members' pushes: 429 in 130 of 131 tries; on a coordinator
    the attacker's submissions were the round's only ones), and four heads could share one
    sequence number. Now each member holds at most its share of the budget (the budget over the
    roster's members, at least one message's worth) and a seq is read once at a time."""
    from p2pfl.runtime.transport import ServerLimits
    from p2pfl.wire.envelope import head_length

    from .helpers import build_in_process, write_tiny

    nodes, _ = build_in_process(write_tiny(tmp_path, nodes=4, rounds=1, samples=40), tmp_path / "run")
    node, attacker, honest = nodes[0], nodes[1], nodes[2]
    frame = model_frame(attacker.parts.key, node, seq=1)
    body_bytes = len(frame) - head_length(frame[:9], len(frame))
    limit = node.transport.limits.max_message_bytes
    node.transport.server_limits = ServerLimits(read_timeout_s=3.0, max_buffered_body_bytes=4 * limit)
    out: dict[str, Any] = {}

    def announced(seq: int, by: Any = attacker) -> tuple[bytes, int]:  # announcing `limit` bytes, no body sent
        full = model_frame(by.parts.key, node, sender=by.config.id, seq=seq)
        return full[:len(full) - body_bytes], limit

    async def scenario() -> None:
        await node.transport.start(node.config.host, node.config.port)
        try:
            held = [asyncio.create_task(_raw_post(node.config.port, *announced(100 + i), timeout=6.0)) for i in range(4)]
            same = [asyncio.create_task(_raw_post(node.config.port, *announced(7, nodes[3]), timeout=6.0))
                    for _ in range(2)]
            await asyncio.sleep(0.5)
            out["attacker holds"] = node.transport.buffered_by_sender.get("node-1")
            async with aiohttp.ClientSession() as session:
                statuses: dict[str, int] = {}
                push = recording_push(session, f"http://127.0.0.1:{node.config.port}", statuses)
                for i in range(5):
                    await push(f"honest {i}", model_frame(honest.parts.key, node, sender="node-2", seq=200 + i))
                out["honest"] = statuses
            out["held"] = [a[:12] for a, _ in await asyncio.gather(*held)]
            out["same seq"] = sorted(a[:12] for a, _ in await asyncio.gather(*same))
            out["after"] = (node.transport.buffered_body_bytes, dict(node.transport.buffered_by_sender),
                            set(node.transport.reading_seqs))
        finally:
            await node.transport.close()

    asyncio.run(scenario())
    head_bytes = len(frame) - body_bytes
    assert out["attacker holds"] == limit - head_bytes  # within its share: 4 x limit over 4 members
    assert sorted(out["held"]) == [b"HTTP/1.1 408"] + [b"HTTP/1.1 429"] * 3  # one waited for its body, three refused
    assert set(out["honest"].values()) == {409}  # read whole and judged (not asked for), never 429
    assert out["same seq"] == [b"HTTP/1.1 408", b"HTTP/1.1 409"]  # the second head of seq 7 refused at once
    assert out["after"] == (0, {}, set())


def test_a_push_told_to_retry_later_is_retried(tmp_path: Path) -> None:
    """Review finding 1 of issue 48: Before, a push answered 429 (the receiver's push budget taken) was dropped: on a coordinator
    the honest nodes' submissions never came and the round went on without them."""
    from p2pfl.runtime.transport import ServerLimits
    from p2pfl.runtime.transport.base import GOODBYE
    from p2pfl.wire.envelope import head_length

    from .helpers import build_in_process, write_tiny

    nodes, _ = build_in_process(write_tiny(tmp_path, nodes=3, rounds=1, samples=40), tmp_path / "run")
    node, attacker, honest = nodes
    frame = model_frame(attacker.parts.key, node, seq=1)
    head = frame[:head_length(frame[:9], len(frame))]
    limit = node.transport.limits.max_message_bytes
    node.transport.server_limits = ServerLimits(read_timeout_s=1.5, max_buffered_body_bytes=limit - len(head))
    out: dict[str, Any] = {}

    async def scenario() -> None:
        await node.transport.start(node.config.host, node.config.port)
        await honest.transport.start(honest.config.host, honest.config.port)
        try:
            holding = asyncio.create_task(_raw_post(node.config.port, head, limit, timeout=6.0))
            await asyncio.sleep(0.3)  # the whole budget is the attacker's head's until its read times out
            started = time.perf_counter()
            out["delivered"] = await honest.transport.push("node-0", kind=GOODBYE, part="", round_=1, version=1,
                                                           tensors={}, timeout=20.0,
                                                           meta={"reason": "test",
                                                                 "statement": honest.transport.own_statement(-1).text})
            out["seconds"] = time.perf_counter() - started
            await holding
        finally:
            await honest.transport.close()
            await node.transport.close()

    asyncio.run(scenario())
    assert out["delivered"] and out["seconds"] > 1.0  # after the attacker's read timed out, not given up at once
    assert any(status == 429 and sender == "node-2" for sender, status, _ in node.transport.rejections)


def test_signed_requests_are_rate_limited_per_member(tmp_path: Path) -> None:
    """Review finding 10 of issue 48: Before, one member's signed reads came 650-1 270 a second (1.67 GB of model in 25 s). Each
    member now has a token bucket: past its burst it gets 429 with Retry-After, and another member
    is served as before."""
    from p2pfl.runtime.transport import ServerLimits
    from p2pfl.runtime.transport.rate import MemberRates

    clock = [0.0]
    rates = MemberRates(per_s=10.0, burst=3.0, clock=lambda: clock[0])
    assert [rates.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert rates.take("a") == pytest.approx(0.1) and rates.take("b") == 0.0  # a's bucket is a's alone
    clock[0] = 0.1
    assert rates.take("a") == 0.0 and rates.take("a") > 0
    assert MemberRates(per_s=0, burst=0).take("a") == 0.0  # off

    peer_key = NodeKey.generate()
    node = _serving(tmp_path, peer_key, ServerLimits(requests_per_s_per_peer=1.0, request_burst_per_peer=5.0))
    statuses: list[int] = []

    async def scenario() -> None:
        base = await _started(node)
        try:
            async with aiohttp.ClientSession() as session:
                for seq in range(1, 9):
                    async with session.get(f"{base}/v1/parts/full?min_version=1",
                                           headers=_read_headers(peer_key, min_version=1, seq=seq)) as resp:
                        statuses.append(resp.status)
                        if resp.status == 429:
                            assert int(resp.headers["Retry-After"]) >= 1
        finally:
            await node.transport.close()

    asyncio.run(scenario())
    assert statuses == [200] * 5 + [429] * 3
    assert [r for r in node.transport.rejections if r[1] == 429 and "signed requests a second" in r[2]]


def test_one_member_holding_the_connection_cap_does_not_lock_another_out(tmp_path: Path) -> None:
    """Review finding 10 of issue 48: Before, a member that kept its connections open had another member's new connections
    refused (96 of 98) while the cap was full. Now a newcomer takes the oldest place of the member
    over its share (cap 6 over 3 members: 2 each), and the refusal names that member."""
    from p2pfl.wire.keys import Roster

    hog, honest = NodeKey.generate(), NodeKey.generate()
    node = _serving(tmp_path, hog, ServerLimits(max_connections=6))
    own = NodeKey.load(tmp_path / "node-0.key")
    node.transport.roster = Roster({"node-0": own.public_hex, "node-1": hog.public_hex, "node-2": honest.public_hex})

    async def signed_read(key: NodeKey, requester: str, seq: int) -> tuple[bytes, asyncio.StreamWriter]:
        """A signed read on a new keep-alive connection: the status line answered, the connection kept."""
        reader, writer = await asyncio.open_connection("127.0.0.1", node.config.port)
        token = request_for(key, requester, "node-0", "nothing", 0, seq)
        writer.write(f"GET /v1/parts/nothing?min_version=0&wait=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     f"{AUTH_HEADER}: {token}\r\n\r\n".encode())
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), 5.0), writer

    async def scenario() -> dict[str, Any]:
        await _started(node)
        seen: dict[str, Any] = {}
        writers = []
        try:
            for seq in range(1, 7):
                line, writer = await signed_read(hog, "node-1", seq)
                writers.append(writer)
                seen.setdefault("hog", []).append(line.split(b" ")[1] if line else b"closed")
            seen["full"] = len(node.transport.connections)
            line, writer = await signed_read(honest, "node-2", 1)
            writers.append(writer)
            seen["honest"] = line.split(b" ")[1] if line else b"closed"
            seen["held"] = sorted(str(g.member) for g in node.transport.connections.values())
        finally:
            for w in writers:
                w.close()
            await node.transport.close()
        return seen

    seen = asyncio.run(scenario())
    assert seen["hog"] == [b"404"] * 6 and seen["full"] == 6
    assert seen["honest"] == b"404"  # served (no such part): let in, not refused
    assert seen["held"] == ["node-1"] * 5 + ["node-2"]
    assert node.transport.rejections.counts[("node-1", 503, "over_connection_share")] == 1
