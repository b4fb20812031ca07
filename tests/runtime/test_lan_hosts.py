"""Across hosts: a network namespace per node and one for the coordinator, with their own
addresses, joined by a bridge (`p2pfl.testbed`). Deployed as operators would: `p2pfl keygen` on
each host, one roster, one config per host, `p2pfl node` / `p2pfl coordinator` in each
namespace. Needs root and iproute2; skipped otherwise (`.ci/run` runs them where it can)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from p2pfl.cli import main
from p2pfl.runtime.config import node_ids
from p2pfl.testbed import NetnsHosts, available

from .helpers import write_tiny

CAN, WHY = available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not CAN, reason=f"cross-host tests: {WHY}")]
PORT = 9000
RUN_LIMIT_S = 240


def _deploy(tmp: Path, bed: NetnsHosts, capsys: pytest.CaptureFixture[str], scenario: Path,
            overrides: tuple[str, ...] = ()) -> dict[str, Path]:
    """Keys made per host, their printed entries pasted into one roster, a config per host."""
    entries = []
    for host in bed.hosts:
        assert main(["keygen", host, "--out", str(tmp / host), "--url", f"http://{bed.address(host)}:{PORT}"]) == 0
        entries.append(capsys.readouterr().out)
    (tmp / "roster.toml").write_text("\n".join(sorted(entries, key=lambda e: e.startswith("[coordinator]"))))
    assert main(["roster", "check", str(tmp / "roster.toml"), "--no-probe"]) == 0
    configs = {}
    for host in bed.hosts:
        config = tmp / host / "config.toml"
        config.write_text(f'id = "{host}"\nkey_file = "{host}.key"\nroster = "../roster.toml"\n'
                          f'scenario = "{scenario}"\nout = "run"\noverrides = {json.dumps(list(overrides))}\n')
        configs[host] = config
    return configs


def _start(tmp: Path, bed: NetnsHosts, configs: dict[str, Path]) -> dict[str, object]:
    return {host: bed.spawn(host, [sys.executable, "-m", "p2pfl", "coordinator" if host == "coordinator" else "node",
                                   str(config)], log=tmp / f"{host}.log")
            for host, config in configs.items()}


def _result(tmp: Path, host: str) -> dict:
    return json.loads((tmp / host / "run" / "nodes" / f"{host}.result.json").read_text())


def _wait(procs: dict[str, object], hosts: list[str], tmp: Path) -> None:
    deadline = time.monotonic() + RUN_LIMIT_S
    for host in hosts:
        try:
            procs[host].wait(timeout=max(1.0, deadline - time.monotonic()))  # type: ignore[attr-defined]
        except Exception:
            pytest.fail(f"{host} did not finish within {RUN_LIMIT_S} s; its log:\n"
                        + (tmp / f"{host}.log").read_text()[-3000:])


@pytest.mark.parametrize("algorithm", ["fedavg", "di"])
def test_an_algorithm_runs_across_hosts_from_the_roster_workflow(tmp_path: Path, capsys, algorithm: str) -> None:
    ids = node_ids(3)
    hosts = ids + (["coordinator"] if algorithm == "di" else [])
    scenario = write_tiny(tmp_path, nodes=3, rounds=2, samples=60, algorithm=algorithm, timeout=60.0)
    with NetnsHosts(hosts) as bed:
        configs = _deploy(tmp_path, bed, capsys, scenario)
        procs = _start(tmp_path, bed, configs)
        _wait(procs, hosts, tmp_path)
        assert all(procs[h].returncode == 0 for h in hosts), {h: (tmp_path / f"{h}.log").read_text()[-2000:]
                                                               for h in hosts if procs[h].returncode}
    for host in ids:
        result = _result(tmp_path, host)
        assert result["status"] == "ok" and len(result["rounds"]) == 2
        if algorithm == "fedavg":
            assert all(r["arrived"] == [p for p in ids if p != host] for r in result["rounds"])
        assert result["totals"]["bytes_received"] > 0
    if algorithm == "di":
        coordinator = json.loads((tmp_path / "coordinator" / "run" / "nodes" / "coordinator.result.json").read_text())
        assert coordinator["status"] == "ok"


def test_a_node_whose_host_goes_down_is_skipped_and_the_others_finish(tmp_path: Path, capsys) -> None:
    ids = node_ids(3)
    # 1500 samples: a round trains for about a second, so the cut lands inside round 2.
    scenario = write_tiny(tmp_path, nodes=3, rounds=4, samples=1500, timeout=4.0)
    with NetnsHosts(ids) as bed:
        configs = _deploy(tmp_path, bed, capsys, scenario, overrides=("runtime.linger_s=4",))
        procs = _start(tmp_path, bed, configs)
        rounds_of_2 = tmp_path / ids[2] / "run" / "nodes" / f"{ids[2]}.rounds.jsonl"
        deadline = time.monotonic() + RUN_LIMIT_S
        while not (rounds_of_2.is_file() and rounds_of_2.read_text().strip()):
            assert time.monotonic() < deadline and procs[ids[2]].poll() is None, "node-2 never finished round 1"
            time.sleep(0.02)
        bed.link_down(ids[2])
        _wait(procs, ids[:2], tmp_path)
    for host in ids[:2]:
        result = _result(tmp_path, host)
        assert result["status"] == "ok" and len(result["rounds"]) == 4, result.get("error")
        other = next(p for p in ids[:2] if p != host)
        fresh = [set(r["arrived"]) - set(r["stale"]) for r in result["rounds"]]
        assert all(other in f for f in fresh)
        # Cut off after its round 1: from round 3 on no fresh part of node-2 can arrive (a
        # stale one, fetched before the cut, may still be used: runtime.accept_stale).
        assert all(ids[2] not in f for f in fresh[2:]), fresh
