"""What the commands refuse, by name and with exit 2, and what they never write (issue 30's
findings and review finding 10): a node id that is a path, a file given where a folder goes,
keys replaced silently, `--together` without `--resume`, a busy dashboard port, files others
could rewrite."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import aiohttp
import pytest

from p2pfl.cli import main
from p2pfl.hosting.ports import free_ports

from ..runtime.helpers import write_tiny


@pytest.mark.parametrize("node_id", ["../evil", "a/b", ".hidden", ""])
def test_keygen_refuses_a_node_id_that_is_a_path(tmp_path: Path, node_id: str, capsys) -> None:
    assert main(["keygen", node_id, "--out", str(tmp_path / "k")]) == 2
    assert "is not a node id" in capsys.readouterr().err
    assert not (tmp_path / "evil.key").exists() and not (tmp_path / "k").exists()


def test_keygen_and_lan_name_a_file_given_as_out_and_lan_keeps_existing_keys(tmp_path: Path, capsys) -> None:
    a_file = tmp_path / "f"
    a_file.write_text("x")
    assert main(["keygen", "node-0", "--out", str(a_file)]) == 2
    assert "is a file" in capsys.readouterr().err
    scenario = write_tiny(tmp_path, nodes=2)
    lan = tmp_path / "lan"
    hosts = ["--hosts", "10.0.0.1:9000,10.0.0.2:9000", "--out", str(lan)]
    assert main(["lan", str(scenario), *hosts]) == 0
    keys = {p.name: p.read_bytes() for p in lan.glob("*.key")}
    capsys.readouterr()
    assert main(["lan", str(scenario), *hosts]) == 2  # before: every key replaced, silently
    assert "already holds keys" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in lan.glob("*.key")} == keys
    assert main(["lan", str(scenario), *hosts, "--force"]) == 0
    assert {p.name: p.read_bytes() for p in lan.glob("*.key")} != keys


@pytest.mark.parametrize("command", ["node", "worker"])
def test_together_without_resume_is_named(tmp_path: Path, command: str, capsys) -> None:
    assert main([command, str(tmp_path / "node-0.toml"), "--together"]) == 2
    assert "error in --together:" in capsys.readouterr().err


def test_a_busy_dashboard_port_is_a_config_error_not_a_traceback(tmp_path: Path, capsys) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        port = busy.getsockname()[1]
        run = tmp_path / "run"
        run.mkdir()
        (run / "scenario.json").write_text(json.dumps({"name": "t", "nodes": 1, "rounds": 1,
                                                       "algorithm": {"name": "fedavg"}}))
        assert main(["dashboard", str(run), "--port", str(port)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error in --port: cannot serve on 127.0.0.1:") and "Traceback" not in err
    finally:
        busy.close()


def test_the_dashboard_serves_on_a_free_port(tmp_path: Path) -> None:
    from p2pfl.report.dashboard import start_dashboard

    async def scenario() -> int:
        runner = await start_dashboard(tmp_path, port=free_ports(1, "127.0.0.1")[0])
        try:
            site = next(iter(runner.sites))
            async with aiohttp.ClientSession() as session, session.get(f"{site.name}/api/state") as resp:
                return resp.status
        finally:
            await runner.cleanup()

    assert asyncio.run(scenario()) == 200


@pytest.mark.slow
def test_files_are_never_writable_by_others_whatever_the_umask(tmp_path: Path) -> None:
    """Review finding 10: Before: under `umask 000` configs and the roster came out world-writable."""
    import os
    import stat
    import subprocess
    import sys

    scenario = write_tiny(tmp_path, nodes=2, rounds=1, samples=40)
    script = ("import os, sys; os.umask(0); from p2pfl.cli import main; "
              "sys.exit(main(sys.argv[1:]))")
    for args in (["lan", str(scenario), "--hosts", "10.0.0.1:9000,10.0.0.2:9000", "--out", str(tmp_path / "lan")],
                 ["run", str(scenario), "--out", str(tmp_path / "run"), "--no-progress"]):
        done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    written = [p for folder in ("lan", "run") for p in (tmp_path / folder).rglob("*")]
    assert written
    loose = [str(p) for p in written if os.stat(p).st_mode & (stat.S_IWGRP | stat.S_IWOTH)]
    assert not loose, loose[:5]


@pytest.mark.slow
def test_a_run_refused_by_its_fields_leaves_no_forking_parent_warm(tmp_path: Path, capsys) -> None:
    """`p2pfl run` starts the nodes' forking parent while it checks the fields; refused, the command
    kills it before it returns. Left warm, the next in-process run took it with this call's
    environment (test_user_strategy's nodes could not import the user's module)."""
    from p2pfl.hosting import forks
    from p2pfl.hosting.warm import take

    if not forks("auto"):
        pytest.skip("this platform does not fork node processes")
    scenario = write_tiny(tmp_path, algorithm="fedavgg")  # placement "process" by default
    assert main(["run", str(scenario), "--out", str(tmp_path / "run")]) == 2
    assert "did you mean 'fedavg'" in capsys.readouterr().err
    assert take() is None
