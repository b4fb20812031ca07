"""Issue 48's numbers measured again after the fixes, against real node processes (`p2pfl node`),
each attack on a fresh federation of 2 nodes whose peer, node-1, is this script (it holds
node-1's key, so what it sends is signed by a roster member) or an outsider with no key:

  stalled  three waves of 16 signed reads of a 13 MB model (a BatchNorm CNN, below) that are never
           read: the node's RSS at rest, with the wave held, and once its write timeout (60 s)
           has passed (finding 3; before: 468 -> 983 MiB, not returned)
  tls      520 silent TLS connections from an outsider, held 1 s; then 20 s of fresh handshakes
           and 28 signed reads (finding 2; before: 0 of 7 744 handshakes, 0 of 28 reads at 65 s)
  takeover a coordinator run (fedavg_global, 3 nodes): node-2, this script, submits a sign-flipped
           model each round (parameters) and, before it, 8 signed heads announcing 64 MiB whose bodies never
           come; node-0 and node-1 are honest processes. The attacker's weight in each round, what
           the coordinator waited for, and the honest nodes' accuracy against the same run with an
           honest node-2 (findings 1 and 5; before: weight 1.0 in all 3 rounds, honest 10 % vs 50 %)
  bn       node-1 trains honestly but serves its BatchNorm running variances as 1e-30 (or -1),
           the update bound on (1, as on a LAN): node-0's final accuracy, loss and status against
           the same run with an honest node-1 (finding 4; before: 0.75 -> 0.108, NaN loss, "ok")

    python benchmarks/review48.py stalled tls takeover bn
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from p2pfl.assembly import assemble_node
from p2pfl.runtime.config import load_node_config
from p2pfl.runtime.run_folder import RunFolder
from p2pfl.scenario.launcher import write_run_folder
from p2pfl.scenario.schema import load_scenario
from p2pfl.wire import NodeKey
from p2pfl.wire.request import AUTH_HEADER, request_for

from hostile_memory import rss_mib, stalled_read  # noqa: E402  (benchmarks/, this script's folder)

MODEL_MODULE = '''
"""A CNN with BatchNorm whose full part is 13 MB (float32)."""
from torch import nn

from p2pfl.models import SplitModel


def bn_cnn(in_channels: int, image_size: int, num_classes: int) -> SplitModel:
    side = image_size // 4
    body = nn.Sequential(
        nn.Conv2d(in_channels, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(64 * side * side, 1024), nn.BatchNorm1d(1024), nn.ReLU(),
    )
    return SplitModel(body, 1024, num_classes)
'''

SCENARIO = """
name = "review48_{attack}"
nodes = {nodes}
seed = {seed}
rounds = {rounds}

[data]
dataset = "mnist"
partition = "iid"
samples_per_node = 1000

[model]
name = "review48_model:bn_cnn"

[algorithm]
name = "{algorithm}"

[train]
epochs = 1

[runtime]
message_limit_mb = 64
start_wait_s = 60
fetch_timeout_s = {fetch_timeout_s}
linger_s = 2
tls = {tls}
update_bound = {update_bound}
"""


class Federation:
    """A run folder of the 2-node scenario in a temporary folder; node-0 started as a process
    (alone, it runs `rounds` rounds of its own: many, so that it is up while it is attacked)."""

    def __init__(self, attack: str, *, rounds: int = 5000, tls: bool = False, fetch_timeout_s: float = 900,
                 seed: int = 0, update_bound: float = 0.0, nodes: int = 2, algorithm: str = "fedavg") -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix=f"review48-{attack}-"))
        (self.tmp / "review48_model.py").write_text(MODEL_MODULE)
        path = self.tmp / "scenario.toml"
        path.write_text(SCENARIO.format(attack=attack, rounds=rounds, tls=str(tls).lower(),
                                        fetch_timeout_s=fetch_timeout_s, seed=seed,
                                        update_bound=update_bound, nodes=nodes, algorithm=algorithm))
        sys.path.insert(0, str(self.tmp))
        self.scenario = load_scenario(path)
        self.out = self.tmp / "run"
        self.paths, self.coordinator_path = write_run_folder(self.scenario, self.out)
        self.config = load_node_config(self.paths[0])
        self.keys = {p.stem: NodeKey.load(self.out / "keys" / f"{p.stem}.key") for p in self.paths}
        self.key = self.keys["node-1"]
        if self.coordinator_path is not None:
            coordinator = load_node_config(self.coordinator_path)
            self.coordinator_address = (coordinator.host, coordinator.port)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.scheme = "https" if tls else "http"
        self.node: subprocess.Popen[bytes] | None = None

    def spawn(self, command: str, config: Path) -> subprocess.Popen[bytes]:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=f"{self.tmp}:{os.environ.get('PYTHONPATH', '')}")
        with open(self.tmp / f"{config.stem}.stderr", "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "p2pfl", command, str(config)], cwd=self.tmp,
                                    stdout=subprocess.DEVNULL, stderr=log, env=env)
        self.procs.append(proc)
        return proc

    def start_node_0(self) -> None:
        self.node = self.spawn("node", self.paths[0])

    def wait_for_round_1(self, timeout_s: float = 300.0) -> None:
        context = ssl._create_unverified_context() if self.scheme == "https" else None  # noqa: SLF001
        import urllib.request

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.scheme}://127.0.0.1:{self.config.port}/v1/status", timeout=2,
                                            context=context) as resp:
                    if json.loads(resp.read()).get("round", 0) >= 1:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"node-0 never reached round 1: {(self.tmp / 'node-0.stderr').read_text()[-2000:]}")

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def idle_peer(port: int) -> None:
    """node-1 as node-0 sees it: up (its status answers) and never serving a part, so that node-0
    waits in its fetch (fetch_timeout_s) instead of training round after round alone: its memory
    then changes only with the attack."""
    from aiohttp import web

    async def status(request: web.Request) -> web.Response:
        return web.json_response({"id": "node-1", "round": 0, "done": False})

    async def never(request: web.Request) -> web.Response:
        await asyncio.sleep(3600)
        return web.Response(status=204)

    async def serve() -> None:
        app = web.Application()
        app.router.add_get("/v1/status", status)
        app.router.add_get("/v1/parts/{part}", never)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        await asyncio.sleep(10**6)

    threading.Thread(target=asyncio.run, args=(serve(),), daemon=True).start()


def stalled(args: argparse.Namespace) -> None:
    fed = Federation("stalled")
    try:
        idle_peer(load_node_config(fed.paths[1]).port)
        fed.start_node_0()
        fed.wait_for_round_1()
        time.sleep(5.0)  # published; waiting for its peer
        assert fed.node is not None
        pid, rest = fed.node.pid, rss_mib(fed.node.pid)
        print(f"stalled reads of a {fed_model_mb(fed):.1f} MB model, 16 a wave; node-0 RSS at rest {rest:.0f} MiB")
        held = []
        for wave in range(3):
            socks = [stalled_read(fed.config.port, fed.key, 1000 * (wave + 1) + i) for i in range(16)]
            held += socks
            time.sleep(5.0)
            during = rss_mib(pid)
            time.sleep(60.0 + 6.0)  # past the write timeout: the node aborts them (the attacker never closes)
            after = rss_mib(pid)
            print(f"  wave {wave + 1}: held {during:.0f} MiB, after the write timeout {after:.0f} MiB "
                  f"({after - rest:+.0f} against rest)")
        for sock in held:
            sock.close()
    finally:
        fed.stop()


def fed_model_mb(fed: Federation) -> float:
    from p2pfl.models import build_model, part_state

    model = build_model(fed.scenario.model.name, 1, 28, 10)
    return sum(t.numel() * t.element_size() for t in part_state(model, "full").values()) / 1e6


def tls(args: argparse.Namespace) -> None:
    fed = Federation("tls", tls=True)
    try:
        fed.start_node_0()
        fed.wait_for_round_1()
        port = fed.config.port
        silent, refused = [], 0
        for _ in range(520):
            try:
                silent.append(socket.create_connection(("127.0.0.1", port)))
            except OSError:  # the listen backlog full: the storm is at its height
                refused += 1
        time.sleep(1.0)
        for sock in silent:
            sock.close()
        context = ssl._create_unverified_context()  # noqa: SLF001 - the node's certificate is self-signed
        handshakes: Counter[str] = Counter()
        stop = time.monotonic() + 20.0

        def shake() -> None:
            while time.monotonic() < stop:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
                        with context.wrap_socket(raw, server_hostname="127.0.0.1"):
                            handshakes["done"] += 1
                except (OSError, ssl.SSLError):
                    handshakes["failed"] += 1

        threads = [threading.Thread(target=shake) for _ in range(4)]
        for t in threads:
            t.start()
        reads = asyncio.run(signed_reads(fed, 28))
        for t in threads:
            t.join()
        print(f"TLS: 520 silent connections ({refused} refused at connect) held 1 s, then 20 s: handshakes {dict(handshakes)}, "
              f"28 signed reads {dict(Counter(reads))}")
    finally:
        fed.stop()


async def signed_reads(fed: Federation, count: int) -> list[int | str]:
    statuses: list[int | str] = []
    async with aiohttp.ClientSession() as session:
        for seq in range(1, count + 1):
            headers = {AUTH_HEADER: request_for(fed.key, "node-1", "node-0", "full", 1, seq)}
            try:
                async with session.get(f"https://127.0.0.1:{fed.config.port}/v1/parts/full?min_version=1",
                                       headers=headers, ssl=False, timeout=aiohttp.ClientTimeout(total=10)) as resp:
                    await resp.read()
                    statuses.append(resp.status)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                statuses.append(type(exc).__name__)
            await asyncio.sleep(0.5)
    return statuses


def bn(args: argparse.Namespace) -> None:
    print("node-0's end when node-1 serves its BatchNorm running variances as ...  (3 rounds)")
    for label, variance in (("honest", None), ("1e-30", 1e-30), ("-1", -1.0)):
        # The update bound on, as a LAN deployment has it (the finding's setting).
        fed = Federation(f"bn_{label}", rounds=3, fetch_timeout_s=60, seed=args.seed, update_bound=1.0)
        try:
            fed.start_node_0()
            attacker = assemble_node(load_node_config(fed.paths[1]), fed.scenario)
            if variance is not None:
                serve_variances(attacker, variance)
            asyncio.run(attacker.run())
            assert fed.node is not None
            fed.node.wait(timeout=600)
            result = json.loads(RunFolder(fed.out).node_result("node-0").read_text())
            rounds = result["rounds"]
            bounded = sum(1 for r in rounds if "node-1" in r.get("peers_bounded", {}))
            refused = sum(1 for r in rounds if r.get("aggregate_refused"))
            print(f"  {label:>7}: final accuracy {result['final_test_acc']:.3f}, test loss {rounds[-1]['test_loss']:.3f}, "
                  f"status {result['status']}, rounds node-1 was pulled back {bounded}, aggregates rolled back "
                  f"{refused}, parts refused {result['rejected'].get('total', 0) if isinstance(result['rejected'], dict) else result['rejected']}")
        finally:
            fed.stop()


def takeover(args: argparse.Namespace) -> None:
    print("a coordinator run of 5 rounds; node-2 floods heads and submits its model sign-flipped (or is honest)")
    for label, hostile in (("honest", False), ("attack", True)):
        fed = Federation(f"takeover_{label}", nodes=3, rounds=5, fetch_timeout_s=60, seed=args.seed,
                         algorithm="fedavg_global")
        try:
            assert fed.coordinator_path is not None
            coordinator = fed.spawn("coordinator", fed.coordinator_path)
            honest = [fed.spawn("node", p) for p in fed.paths[:2]]
            attacker = assemble_node(load_node_config(fed.paths[2]), fed.scenario)
            if hostile:
                flood_then_flip(attacker, fed)
            asyncio.run(attacker.run())
            for proc in [*honest, coordinator]:
                proc.wait(timeout=600)
            folder = RunFolder(fed.out)
            coord = json.loads(folder.node_result("coordinator").read_text())
            weights = [round(r["weights"].get("node-2", 0.0), 3) for r in coord["rounds"]]
            missing = [r.get("missing_live", []) for r in coord["rounds"]]
            accs = [json.loads(folder.node_result(f"node-{i}").read_text())["final_test_acc"] for i in (0, 1)]
            told_later = sum((fed.tmp / f"node-{i}.stderr").read_text().count(" 429") for i in (0, 1))
            refused = {f"{c['sender']} {c['status']} {c['reason']}": c["count"]
                       for c in coord.get("rejected", {}).get("counts", [])}
            print(f"  {label:>7}: node-2's weight by round {weights}, live members aggregated without {missing}, "
                  f"coordinator {coord['status']}; honest accuracy {accs[0]:.3f} / {accs[1]:.3f}; "
                  f"429 lines in honest logs {told_later}; the coordinator refused {refused}")
        finally:
            fed.stop()


def flood_then_flip(node: Any, fed: Federation) -> None:
    """Before each push to the coordinator: 8 heads of its kind announcing 64 MiB, bodies never sent;
    then the push itself with every parameter's sign flipped."""
    import numpy as np

    from p2pfl.wire import encode
    from p2pfl.wire.envelope import head_length

    push, held = node.transport.push, []
    host, port = fed.coordinator_address

    async def hostile(target: str, *, kind: str, part: str, round_: int, version: int, tensors: Any, meta: Any,
                      timeout: float) -> bool:
        if target == "coordinator":
            total = 64 * 2**20
            for _ in range(8):
                frame = encode(key=fed.keys["node-2"], kind=kind, sender="node-2", recipient=target, round=round_,
                               version=version, seq=node.transport.next_seq(), part=part, meta=dict(meta),
                               tensors={"w": np.zeros(4, np.float32)})
                head = frame[: head_length(frame[:9], len(frame))]
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(f"POST /v1/inbox HTTP/1.1\r\nHost: x\r\nContent-Length: {total}\r\n\r\n".encode() + head)
                await writer.drain()
                held.append(writer)  # never closed by the attacker
            # Parameters only: a negative running variance is refused on its own (finding 4).
            tensors = {k: (v if "running_" in k or "num_batches" in k else -v) for k, v in tensors.items()}
        return await push(target, kind=kind, part=part, round_=round_, version=version, tensors=tensors, meta=meta,
                          timeout=timeout)

    node.transport.push = hostile


def serve_variances(node: Any, variance: float) -> None:
    """What node-1 publishes carries `variance` in every BatchNorm running variance."""
    publish = node.transport.publish

    async def poisoned(version: int, round_: int, parts: dict[str, Any], meta: dict[str, Any], *a: Any, **k: Any) -> Any:
        parts = {name: {key: (t.clone().fill_(variance) if key.endswith("running_var") else t)
                        for key, t in tensors.items()} if isinstance(tensors, dict) else tensors
                 for name, tensors in parts.items()}
        return await publish(version, round_, parts, meta, *a, **k)

    node.transport.publish = poisoned


ATTACKS = {"stalled": stalled, "tls": tls, "takeover": takeover, "bn": bn}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("attacks", nargs="*", choices=sorted(ATTACKS), default=sorted(ATTACKS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for name in args.attacks:
        ATTACKS[name](args)


if __name__ == "__main__":
    main()
