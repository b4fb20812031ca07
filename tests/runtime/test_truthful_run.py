"""A run that tells the truth while it runs: a node that never hears from any peer ends
`isolated` (non-zero exit), silent peers are warned about, every round gets one readable log
line, and `--log-level` / `--version` work."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path

import pytest

from p2pfl.cli import main
from p2pfl.logs import LEVEL_ENV, configure
from p2pfl.runtime.run_folder import RunFolder
from p2pfl.scenario.results import build_results, download_health, format_summary
from p2pfl.wire import NodeKey

from .helpers import lone_node, scenario_of


@pytest.fixture(autouse=True)
def _root_logger_restored() -> object:
    """Some tests configure logging as a node process does; later tests get the root logger back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_a_node_whose_peers_are_all_down_ends_isolated(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    node = lone_node(tmp_path, NodeKey.generate(), start_wait_s=0.5)  # its one peer is never started
    caplog.set_level(logging.INFO, logger="p2pfl")
    result = asyncio.run(node.run())
    assert result["status"] == "isolated"
    assert [(r["asked"], r["arrived"]) for r in result["rounds"]] == [(1, []), (1, [])]
    text = caplog.text
    assert "round 1/2: acc" in text and "0 of 1 peers answered" in text
    assert text.count("node-1 did not answer") == 1  # warned once, not every round
    assert "ended isolated" in text
    # The node's result file, as its process writes it; its peer, never started, wrote none.
    written = RunFolder(tmp_path / "run").node_result("node-0")
    written.parent.mkdir(parents=True, exist_ok=True)
    written.write_text(json.dumps(result))
    results = build_results(scenario_of(node), tmp_path / "run", {"node-0": 1, "node-1": 1}, 1.0, {})
    assert "node-0" in results["summary"]["nodes_failed"]
    assert [r["unanswered"] for r in result["rounds"]] == [1, 1]
    downloads = download_health([result])
    assert (downloads["asked_second_half"], downloads["unanswered_second_half"]) == (1, 1)
    assert "100 % of the downloads asked for in the second half" in format_summary(results)


def test_a_local_node_asks_for_nobody_and_is_not_isolated(tmp_path: Path) -> None:
    from .helpers import build_in_process, run_in_process, write_tiny

    nodes, _ = build_in_process(write_tiny(tmp_path, nodes=2, rounds=1, samples=40, algorithm="local"), tmp_path / "run")
    results, _, _ = run_in_process(nodes, None)
    assert {r["status"] for r in results} == {"ok"}


def test_log_level_reaches_the_processes_a_command_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LEVEL_ENV, "INFO")  # restored after the test
    code = main(["run", str(tmp_path / "missing.toml"), "--out", str(tmp_path / "run"), "--log-level", "warning"])
    assert code == 2
    assert os.environ[LEVEL_ENV] == "WARNING"
    configure()
    assert logging.getLogger().level == logging.WARNING
    monkeypatch.setenv(LEVEL_ENV, "INFO")
    configure()


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("p2pfl 0.")


@pytest.mark.slow
def test_an_out_that_is_a_file_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from .helpers import write_tiny

    target = tmp_path / "results.txt"
    target.write_text("mine")
    assert main(["run", str(write_tiny(tmp_path)), "--out", str(target), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error in --out:") and "is a file" in err
    assert target.read_text() == "mine"


def test_a_port_already_in_use_is_one_line_and_exit_2(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import socket

    from p2pfl import assembly

    node = lone_node(tmp_path, NodeKey.generate())
    with socket.socket() as taken:
        taken.bind((node.config.host, node.config.port))
        taken.listen()
        caplog.set_level(logging.ERROR, logger="p2pfl")
        assert assembly._hosting([node.config], resume=False) == [{}]
    assert "already in use" in caplog.text
    assert "Traceback" not in caplog.text


def test_ctrl_c_is_one_line_and_exit_130(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    from p2pfl import cli

    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_dispatch", interrupted)
    assert main(["run", "s.toml", "--out", str(tmp_path / "run")]) == 130
    err = capsys.readouterr().err
    assert err.startswith("interrupted") and "--resume" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_an_impossible_partition_stops_the_run_before_any_process_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from .helpers import write_tiny

    scenario = write_tiny(tmp_path, extra="")
    code = main(["run", str(scenario), "--out", str(tmp_path / "run"), "--no-progress",
                 "--set", 'data.partition="pathological"', "--set", "data.classes_per_node=11"])
    assert code == 2
    assert capsys.readouterr().err.startswith("error in data.classes_per_node:")
    assert not (tmp_path / "run" / "logs").exists()


def test_a_cap_above_every_share_is_said(tmp_path: Path) -> None:
    from p2pfl.data import DataSpec, build_partition

    partition = build_partition(DataSpec(dataset="mnist", samples_per_node=999_999), 10, 0, only=[])
    assert partition.meta["largest_share"] == 500
    assert "largest_share" not in build_partition(DataSpec(dataset="mnist", samples_per_node=100), 10, 0, only=[]).meta


def test_a_node_process_stopped_by_ctrl_c_exits_130_without_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from p2pfl import assembly

    async def interrupted(*args: object, **kwargs: object) -> list:
        raise KeyboardInterrupt

    node = lone_node(tmp_path, NodeKey.generate())
    monkeypatch.setattr(assembly, "host_nodes", interrupted)
    assert assembly.run_node(node.config) == 130  # its process's logging goes to stderr
    err = capsys.readouterr().err
    assert "interrupted; rounds finished so far are checkpointed" in err and "Traceback" not in err
