"""A hostile seed against a joining member (issue 63, point 6): what thousands of addresses,
non-members and loops in a seed's answers cost the member that asks it.

Two processes on 127.0.0.1. The **seed** is a genuine member of the federation (its certificate
is real, so the joiner admits it) and answers every federation exchange (`POST
/v1/service/federation`, the carrier's service route) with one of:

* ``strangers``: its own record, then 4096 records of non-members (certificates signed by a key
  that is not the federation's), each with its own address;
* ``itself``: 4096 records of its own, each signed anew with a later time and another address:
  the joiner's own address, the seed's, and 4094 addresses nobody listens on (loops and a fan-out);
* ``replayed``: the records of 64 real members, each replayed 64 times (4096 in all), with
  addresses nobody listens on;
* ``oversized``: 5 MiB of records (past the 4 MiB an exchange may be).

The **joiner** (this process: the federation's `Gossip` and `Directory`, exactly as a node's
federation member runs them, outbound only) discovers from the seed, then gossips for
`--periods` periods of `--period-s`. Printed per answer: the discovery's time, the seconds an
exchange costs the joiner, the records it holds at the end, the refusals it noted, its resident
memory's growth (VmRSS) and open file descriptors at the end against before, and how many TCP
connections the seed accepted from it.

    python benchmarks/hostile_seed.py [--periods 20] [--period-s 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import socket
import time
from typing import Any

from aiohttp import web

from p2pfl.runtime.federation.certificates import issue
from p2pfl.runtime.federation.directory import MAX_RECORDS, Directory
from p2pfl.runtime.federation.gossip import PATH, Gossip, encode
from p2pfl.runtime.federation.records import sign_record
from p2pfl.wire import NodeKey

KINDS = ("strangers", "itself", "replayed", "oversized")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def hostile_answer(kind: str, federation: NodeKey, seed_key: NodeKey, seed_url: str, joiner_url: str,
                   now: float) -> bytes:
    """The one answer the hostile seed gives to every exchange (built once: signing is not the
    seed's cost we measure)."""
    certificate = issue(federation, "seed", seed_key.public_hex, now=now - 60)
    own = sign_record(seed_key, certificate, seed_url, now=now - 30)
    records: list[dict[str, Any]] = []
    if kind == "strangers":
        stranger = NodeKey.generate()
        for i in range(MAX_RECORDS):
            key = NodeKey.generate()
            records.append(sign_record(key, issue(stranger, f"stranger-{i}", key.public_hex, now=now - 60),
                                       f"http://10.9.{i // 250}.{i % 250 + 1}:9000", now=now - 30).to_dict())
    elif kind == "itself":
        urls = [joiner_url, seed_url] + [f"http://10.9.{i // 250}.{i % 250 + 1}:9000" for i in range(MAX_RECORDS - 2)]
        records = [sign_record(seed_key, certificate, url, now=now - 30 + (i + 1) * 1e-3).to_dict()
                   for i, url in enumerate(urls)]
    elif kind == "replayed":
        members = []
        for i in range(64):
            key = NodeKey.generate()
            members.append(sign_record(key, issue(federation, f"member-{i}", key.public_hex, now=now - 60),
                                       f"http://10.8.0.{i + 1}:9000", now=now - 30).to_dict())
        records = [members[i % 64] for i in range(MAX_RECORDS)]
    elif kind == "oversized":
        stranger = NodeKey.generate()
        key = NodeKey.generate()
        one = sign_record(key, issue(stranger, "x", key.public_hex, now=now - 60), seed_url, now=now - 30).to_dict()
        records = [one] * 9000  # about 5 MiB once packed
    else:
        raise ValueError(f"unknown answer {kind!r}: one of {', '.join(KINDS)}")
    return encode({"from": own.to_dict(), "records": records})


def serve_hostile(kind: str, federation_hex: str, seed_hex: str, port: int, joiner_url: str, ready: Any,
                  accepted: Any) -> None:
    """The seed's process: answers every exchange with `hostile_answer`, counting connections."""
    federation, seed_key = NodeKey.from_private_hex(federation_hex), NodeKey.from_private_hex(seed_hex)
    answer = hostile_answer(kind, federation, seed_key, f"http://127.0.0.1:{port}", joiner_url, time.time())

    async def exchange(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=answer, content_type="application/msgpack")

    async def main() -> None:
        app = web.Application(client_max_size=8 << 20)
        app.router.add_post(PATH, exchange)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        loop = asyncio.get_running_loop()
        server = runner.server
        assert server is not None

        def counted() -> asyncio.Protocol:
            with accepted.get_lock():
                accepted.value += 1
            return server()

        await loop.create_server(counted, "127.0.0.1", port)
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


def _rss_mib() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def join(federation: NodeKey, seed_url: str, periods: int, period_s: float) -> dict[str, Any]:
    key = NodeKey.generate()
    own = sign_record(key, issue(federation, "joiner", key.public_hex, now=time.time() - 60), None, now=time.time())
    gossip = Gossip(Directory(federation.public_hex, own), period_s=period_s, timeout_s=10.0)
    rss, fds = _rss_mib(), _fds()
    started = time.perf_counter()
    try:
        await gossip.discover([seed_url], wait_s=5.0)
        discovered = f"admitted in {time.perf_counter() - started:.2f} s"
    except Exception as exc:  # NoSeedAnswered: the seed's answer refused; said, and the joiner goes on
        discovered = f"not admitted ({str(exc)[:160]}) after {time.perf_counter() - started:.2f} s"
    per_exchange = []
    for _ in range(periods):  # the gossip loop's exchange with the one member known, timed each
        t0 = time.perf_counter()
        try:
            await gossip.exchange(seed_url)
        except Exception:
            pass
        per_exchange.append(time.perf_counter() - t0)
        await asyncio.sleep(period_s)
    directory = gossip.directory
    result = {"discovery": discovered, "exchange_s": max(per_exchange), "records": sorted(directory.records),
              "seed_url": directory.records["seed"].url if "seed" in directory.records else None,
              "refusals": directory.refusals, "refused_kept": len(directory.refused),
              "rss_growth_mib": _rss_mib() - rss, "fds_growth": _fds() - fds}
    await gossip.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--periods", type=int, default=20)
    parser.add_argument("--period-s", type=float, default=0.5)
    parser.add_argument("--kinds", default=",".join(KINDS))
    args = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    print("| seed's answer | discovery | slowest exchange, s | records held | refusals noted (kept by name) "
          "| RSS growth MiB | fds growth | connections the seed accepted |")
    print("|---|---|---|---|---|---|---|---|")
    for kind in args.kinds.split(","):
        federation, seed_key = NodeKey.generate(), NodeKey.generate()
        port = _free_port()
        ready, accepted = context.Event(), context.Value("i", 0)
        seed = context.Process(target=serve_hostile, args=(kind, federation.private_hex(), seed_key.private_hex(), port,
                                                           f"http://127.0.0.1:{_free_port()}", ready, accepted),
                               daemon=True)
        seed.start()
        try:
            if not ready.wait(120):
                raise SystemExit(f"{kind}: the hostile seed did not start")
            result = asyncio.run(join(federation, f"http://127.0.0.1:{port}", args.periods, args.period_s))
        finally:
            seed.terminate()
            seed.join()
        records = f"{len(result['records'])}" + (" (seed among them)" if "seed" in result["records"] else "")
        print(f"| {kind} | {result['discovery']} | {result['exchange_s']:.2f} | {records} (seed at "
              f"{result['seed_url']}) | {result['refusals']} ({result['refused_kept']}) | "
              f"{result['rss_growth_mib']:.1f} | {result['fds_growth']} | {accepted.value} |", flush=True)


if __name__ == "__main__":
    main()
