"""How fast a revocation reaches every member of a larger federation (issue 63, point 6).

`--members` members (default 100; `--outbound` of them outbound only, whom no flood reaches)
spread over `--processes` processes on 127.0.0.1, each member the federation's `Directory` and
`Gossip` as a node runs them, serving the exchange on a port of its own (outbound-only members
serve nothing). Every member discovers from member 0 (the seed) and gossips every `--period-s`;
once every member knows every other, the operator tells the seed one revocation (one exchange,
as `p2pfl federation tell` sends it). Each member notes the wall time it took the list; printed:
when the reachable members and the outbound-only ones had it after the seed was told (median,
90th percentile, last; seconds and gossip periods), and who never did.

    python benchmarks/revocation_spread.py [--members 100] [--processes 4] [--outbound 10] [--period-s 2]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import socket
import statistics
import time
from typing import Any

import aiohttp
from aiohttp import web

from p2pfl.runtime.federation.certificates import issue, revoke
from p2pfl.runtime.federation.directory import Directory
from p2pfl.runtime.federation.gossip import PATH, Gossip, encode
from p2pfl.runtime.federation.records import sign_record
from p2pfl.wire import NodeKey


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def host(members: list[dict[str, Any]], federation_public: str, seed_url: str, period_s: float, everyone: int,
         events: Any, go: Any) -> None:
    """One process's members: serve, discover from the seed, gossip; report convergence and the
    moment each took a newer revocation list."""

    logging.getLogger("p2pfl").setLevel(logging.CRITICAL)  # each member's admissions and refusals: thousands of lines

    async def main() -> None:
        runners, gossips = [], []
        for m in members:
            key = NodeKey.from_private_hex(m["key"])
            certificate = issue(NodeKey.from_private_hex(m["issuer"]), m["name"], key.public_hex, now=m["issued"])
            url, box = None, {}  # the member's gossip, built once its record can name its address
            if m["reachable"]:  # bound first (the seed at its known port, the others at any): the record names it
                async def exchange(request: web.Request, box: dict[str, Gossip] = box) -> web.Response:
                    status, answer = await box["gossip"].handle(await request.read())
                    return web.Response(status=status, body=answer)
                app = web.Application(client_max_size=8 << 20)
                app.router.add_post(PATH, exchange)
                runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
                await runner.setup()
                await web.TCPSite(runner, "127.0.0.1", m["port"]).start()
                runners.append(runner)
                url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            own = sign_record(key, certificate, url, now=time.time())
            gossip = Gossip(Directory(federation_public, own), period_s=period_s, timeout_s=5.0,
                            seed=hash(m["name"]) & 0xFFFF)
            box["gossip"] = gossip
            gossip.directory.on_revocations.append(lambda _, name=m["name"]: events.put(("revoked", name, time.time())))
            gossips.append(gossip)
        await asyncio.gather(*(g.discover([seed_url], wait_s=60.0) for g in gossips))
        for gossip in gossips:
            gossip.start()
        told = set()
        while not go.is_set():
            for m, gossip in zip(members, gossips):
                if m["name"] not in told and len(gossip.directory.records) == everyone - 1:
                    told.add(m["name"])
                    events.put(("converged", m["name"], time.time()))
            await asyncio.sleep(0.1)
        await asyncio.sleep(10 * period_s + 5)  # the revocation's spread, then down
        for gossip in gossips:
            await gossip.close()
        for runner in runners:
            await runner.cleanup()

    asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=100)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--outbound", type=int, default=10)
    parser.add_argument("--period-s", type=float, default=2.0)
    args = parser.parse_args()
    federation = NodeKey.generate()
    now = time.time() - 60
    members = []
    for i in range(args.members):
        outbound = i >= args.members - args.outbound  # the seed (member 0) is reachable
        members.append({"name": f"m{i:04d}", "key": NodeKey.generate().private_hex(), "issuer": federation.private_hex(),
                        "issued": now, "reachable": not outbound, "port": _free_port() if i == 0 else 0})
    outbound_names = {m["name"] for m in members if not m["reachable"]}
    seed_url = f"http://127.0.0.1:{members[0]['port']}"
    context = multiprocessing.get_context("spawn")
    events, go = context.Queue(), context.Event()
    processes = [context.Process(target=host, args=(members[p::args.processes], federation.public_hex, seed_url,
                                                    args.period_s, args.members, events, go), daemon=True)
                 for p in range(args.processes)]
    started = time.time()
    for process in processes:
        process.start()
    converged: set[str] = set()
    try:
        while len(converged) < args.members:
            kind, name, _ = events.get(timeout=300)
            converged.add(name) if kind == "converged" else None
        print(f"{args.members} members over {args.processes} processes ({args.outbound} outbound only), gossip every "
              f"{args.period_s:g} s: every member knew every other {time.time() - started:.1f} s after the start")
        victim = str(members[1]["name"])
        revocations = revoke(federation, None, victim, now=time.time())

        async def tell() -> None:
            async with aiohttp.ClientSession() as session:
                async with session.post(seed_url + PATH, data=encode({"revocations": revocations.to_dict()})) as answer:
                    assert answer.status == 200, await answer.text()

        told_at = time.time()
        asyncio.run(tell())
        took: dict[str, float] = {}
        deadline = time.time() + 10 * args.period_s + 4
        while len(took) < args.members and time.time() < deadline:
            try:
                kind, name, at = events.get(timeout=max(0.1, deadline - time.time()))
            except Exception:
                break
            if kind == "revoked":
                took[name] = at - told_at
        go.set()
    finally:
        go.set()
        for process in processes:
            process.join(timeout=60)
            if process.is_alive():
                process.terminate()
    print(f"the revoked member ({victim}) had the list {took[victim]:.2f} s after: refused by the others, told why" if victim in took
          else f"the revoked member ({victim}) never had the list")
    for label, names in (("reachable", {m["name"] for m in members} - outbound_names - {victim}), ("outbound only", outbound_names)):
        delays = sorted(took[n] for n in names if n in took)
        never = sorted(names - set(took))
        if delays:
            p90 = delays[min(len(delays) - 1, int(0.9 * len(delays)))]
            print(f"{label} ({len(names)}): median {statistics.median(delays):.2f} s, 90th percentile {p90:.2f} s, "
                  f"last {delays[-1]:.2f} s ({delays[-1] / args.period_s:.2f} gossip periods)"
                  + (f"; never: {', '.join(never)}" if never else ""))
        else:
            print(f"{label} ({len(names)}): none took it" + (f"; never: {', '.join(never)}" if never else ""))


if __name__ == "__main__":
    main()
