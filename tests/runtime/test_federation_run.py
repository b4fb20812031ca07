"""A federation that grows from one address, on 127.0.0.1 ports, with real `p2pfl node` processes
deployed as docs/lan.md says: the operator's `p2pfl federation init / admit / revoke`, one
`p2pfl keygen` and one config per host, every config naming the same single seed address.

Every step waits for what it needs to see (a node's round on its status), never for a time."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from p2pfl.cli import main
from p2pfl.hosting.ports import free_ports
from p2pfl.runtime.federation.certificates import EXPIRED, REVOKED, UNKNOWN, WRONG_FEDERATION, Certificate, issue
from p2pfl.runtime.federation.directory import Directory
from p2pfl.runtime.federation.gossip import ExchangeFailed, Gossip
from p2pfl.runtime.federation.records import sign_record
from p2pfl.wire import NodeKey

pytestmark = pytest.mark.slow
ROUNDS = 100
LIMIT_S = 300
GOSSIP_S = 1.0
ROOT = Path(__file__).resolve().parents[2]

SCENARIO = """
name = "federation"
nodes = 3                 # the members the federation starts with
seed = 0
rounds = {rounds}
[data]
dataset = "mnist"
partition = "iid"
samples_per_node = 300    # this host's own data: the first 300 of the 5000 MNIST samples
[model]
name = "cnn"
[algorithm]
name = "fedavg"
[train]
epochs = 1
batch_size = 32
[runtime]
fetch_timeout_s = 30
linger_s = 10
start_wait_s = 120
message_limit_mb = 4
torch_threads = 1
"""


def _host(tmp: Path, fed: Path, name: str, port: int | None, seed_port: int, capsys: pytest.CaptureFixture[str]) -> Path:
    """What one host does: its key, the operator's certificate for it, its config."""
    assert main(["keygen", name, "--out", str(tmp / name)]) == 0
    assert main(["federation", "admit", str(tmp / name / f"{name}.pub"), "--id", name, "--dir", str(fed),
                 "--out", str(tmp / name / f"{name}.cert")]) == 0
    capsys.readouterr()
    return _config(tmp, name, port, seed_port, fed / "federation.pub")


def _config(tmp: Path, name: str, port: int | None, seed_port: int, federation_pub: Path,
            seed_wait_s: float = 30) -> Path:
    """`port` None: an outbound-only host (no url: nobody reads it; it pushes its parts)."""
    config = tmp / name / "node.toml"
    where = "" if port is None else f'port = {port}\n'
    url = "" if port is None else f'url = "http://127.0.0.1:{port}"\n'
    config.write_text(
        f'id = "{name}"\nkey_file = "{name}.key"\nscenario = "../scenario.toml"\nout = "run"\nhost = "127.0.0.1"\n'
        f"{where}\n[federation]\npublic_key = \"{federation_pub}\"\ncertificate = \"{name}.cert\"\n"
        f'seeds = ["http://127.0.0.1:{seed_port}"]\n{url}gossip_s = {GOSSIP_S}\nseed_wait_s = {seed_wait_s}\n')
    return config


def _start(tmp: Path, name: str, *extra: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(tmp / f"{name}.log", "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "p2pfl", "node", str(tmp / name / "node.toml"), *extra],
                                stdout=log, stderr=subprocess.STDOUT, env=env)


def _round(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/status", timeout=2) as answer:
            return int(json.loads(answer.read())["round"])
    except OSError:
        return None


def _until(what: str, test, procs: dict[str, subprocess.Popen[bytes]], tmp: Path, deadline: float) -> None:
    while not test():
        ended = {n: p.returncode for n, p in procs.items() if p.poll() is not None}
        if time.monotonic() > deadline or ended:
            logs = "\n".join(f"== {n}\n" + (tmp / f"{n}.log").read_text()[-3000:] for n in procs)
            pytest.fail(f"waiting for {what}: ended {ended}\n{logs}")
        time.sleep(0.1)


def _result(tmp: Path, name: str) -> dict:
    return json.loads((tmp / name / "run" / "nodes" / f"{name}.result.json").read_text())


def _exchange_as(fed_public: str, cert: Certificate | None, key: NodeKey, seed: str) -> str:
    """What the seed answers a member whose record carries `cert` (None: no certificate)."""
    signing_cert = cert or issue(NodeKey.generate(), "nocert", key.public_hex, now=time.time())
    record = sign_record(key, signing_cert, None, now=time.time())
    gossip = Gossip(Directory(fed_public, record))
    payload = gossip.directory.payload()
    if cert is None:
        payload["from"] = {**payload["from"], "certificate": None}

    async def once() -> str:
        try:
            await gossip.exchange(seed, payload)
            return "admitted"
        except ExchangeFailed as failed:
            return str(failed)
        finally:
            await gossip.close()

    return asyncio.run(once())


def test_a_federation_grows_from_one_seed_admits_a_late_host_and_refuses_the_revoked_and_the_unadmitted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tmp = tmp_path
    (tmp / "scenario.toml").write_text(SCENARIO.format(rounds=ROUNDS))
    fed = tmp / "fed"
    assert main(["federation", "init", "--dir", str(fed)]) == 0
    ports = dict(zip(["h0", "h1", "h2", "h3", "stranger", "nobody"], free_ports(6, "127.0.0.1")))
    seed = f"http://127.0.0.1:{ports['h0']}"
    for name in ("h0", "h1", "h2", "h3"):
        _host(tmp, fed, name, ports[name], ports["h0"], capsys)
    _host(tmp, fed, "out", None, ports["h0"], capsys)
    # A host admitted by another federation's key, and one whose only seed listens nowhere.
    assert main(["federation", "init", "--dir", str(tmp / "other")]) == 0
    _host(tmp, tmp / "other", "stranger", ports["stranger"], ports["h0"], capsys)
    assert main(["keygen", "lost", "--out", str(tmp / "lost")]) == 0
    assert main(["federation", "admit", str(tmp / "lost" / "lost.pub"), "--id", "lost", "--dir", str(fed),
                 "--out", str(tmp / "lost" / "lost.cert")]) == 0
    _config(tmp, "lost", free_ports(1, "127.0.0.1")[0], ports["nobody"], fed / "federation.pub", seed_wait_s=1)

    procs = {name: _start(tmp, name) for name in ("h0", "h1", "h2", "out")}
    deadline = time.monotonic() + LIMIT_S
    try:
        _until("round 1 at the seed", lambda: (_round(ports["h0"]) or 0) >= 1, procs, tmp, deadline)
        procs["h3"] = _start(tmp, "h3", "--join")
        refused = {"stranger": _start(tmp, "stranger"), "lost": _start(tmp, "lost")}
        fed_public = (fed / "federation.pub").read_text().strip()
        key = NodeKey.generate()
        answers = {
            "expired": _exchange_as(fed_public, issue(NodeKey.load(fed / "federation.key"), "ghost", key.public_hex,
                                                      now=time.time() - 100, expires=time.time() - 1), key, seed),
            "none": _exchange_as(fed_public, None, key, seed),
        }
        _until("h3 to join", lambda: (_round(ports["h3"]) or 0) >= 1, procs, tmp, deadline)
        told_at = time.time()
        assert main(["federation", "revoke", "h2", "--dir", str(fed), "--tell", seed]) == 0
        assert f"{seed}: taken" in capsys.readouterr().out
        for name, proc in {**procs, **refused}.items():
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for proc in [*procs.values(), *locals().get("refused", {}).values()]:
            if proc.poll() is None:
                proc.kill()
    logs = {name: (tmp / f"{name}.log").read_text() for name in [*procs, "stranger", "lost"]}

    # Not admitted: each says why in one line and exits 2, naming the seed and its answer.
    assert refused["stranger"].returncode == 2 and refused["lost"].returncode == 2, logs
    assert f"{seed}: refused this node: 403 {WRONG_FEDERATION}" in logs["stranger"]
    assert f"http://127.0.0.1:{ports['nobody']}: cannot connect" in logs["lost"]
    assert "Traceback" not in logs["stranger"] + logs["lost"]
    assert answers["expired"].startswith(f"refused this node: 403 {EXPIRED}")
    assert answers["none"].startswith(f"refused this node: 403 {UNKNOWN}")

    results = {name: _result(tmp, name) for name in procs}
    seed_refused = results["h0"]["federation"]["refused"]
    assert seed_refused["stranger"] == WRONG_FEDERATION and seed_refused["ghost"] == EXPIRED, seed_refused
    assert seed_refused["h2"] == REVOKED
    assert "refused member 'stranger': wrong_federation" in logs["h0"]

    for name in ("h0", "h1", "h3", "out"):
        result = results[name]
        assert result["status"] == "ok", (name, result["status"], logs[name][-2000:])
        assert [r["round"] for r in result["rounds"]][-1] == ROUNDS
        # Every member found the others from the one seed (h3 too, started late).
        assert set(result["federation"]["members"]) == {"h0", "h1", "h3", "out"} - {name}
        [removal] = [r for r in result["federation"]["removed"] if r["member"] == "h2"]
        assert removal["cause"] == REVOKED
        # Within one gossip period: told at once (a flood), or, outbound only (no flood reaches it),
        # at its next exchange, which the period schedules.
        assert removal["at"] - told_at <= GOSSIP_S + (0.5 if name == "out" else 0), (name, removal["at"] - told_at)
        # No part of the revoked member is aggregated in a round that began after its removal.
        after = [r for r in result["rounds"] if r["started_at"] > removal["at"]]
        assert after and all("h2" not in r["arrived"] for r in after)
        before = [r for r in result["rounds"] if r["started_at"] < told_at - 1]
        assert any("h2" in r["arrived"] for r in before) or name == "h3"
    # The late host joined in the round the others were in, from a member's model, and ran to the end.
    joined = results["h3"]["membership"][0]
    assert joined["event"] == "joined" and joined["from"] in ("h0", "h1", "h2") and joined["round"] >= 2
    assert all(r["arrived"] for r in results["h3"]["rounds"])
    h0_rounds = {r["round"]: r for r in results["h0"]["rounds"]}
    assert any("h3" in h0_rounds[r]["arrived"] for r in range(joined["round"] + 1, ROUNDS + 1))
    # Nobody can read the outbound-only host: it took its neighbours' parts in every round, and they
    # took the parts it pushed in every round from the first it was in step with them (a part it
    # pushed for a round they had left is refused as stale, as a read's would be).
    assert all(r["arrived"] for r in results["out"]["rounds"])
    for name in ("h0", "h1", "h3"):
        took = [r["round"] for r in results[name]["rounds"] if "out" in r["arrived"]]
        assert took and took == list(range(took[0], ROUNDS + 1)), (name, took)
        assert took[0] <= 10 or name == "h3"
    # The revoked member's reads are refused, by name, from then on.
    refusals = [c for r in ("h0", "h1", "h3") for c in results[r]["rejected"]["counts"] if REVOKED in json.dumps(c)]
    assert refusals, [results[r]["rejected"] for r in ("h0", "h1", "h3")]
    assert results["h2"]["status"] in ("degraded", "isolated", "ok")
