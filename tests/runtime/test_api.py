"""The Python API: run and compare return typed results, load them back from the folder, and
work from inside a running event loop, as in a notebook."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

import p2pfl
from p2pfl.scenario.schema import read_raw

from .helpers import write_tiny

pytestmark = pytest.mark.slow


def test_run_returns_what_results_json_says_and_loads_back(tmp_path: Path) -> None:
    scenario = write_tiny(tmp_path, nodes=2, rounds=2, samples=40)
    results = p2pfl.run(scenario, out=tmp_path / "run", overrides=["rounds=1"])
    raw = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results.ok and results.algorithm == "fedavg" and results.scenario["rounds"] == 1
    assert [n.id for n in results.nodes] == ["node-0", "node-1"]
    node = results.node("node-1")
    assert node.status == "ok" and len(node.rounds) == 1
    assert node.rounds[0].test_acc == raw["nodes"][1]["rounds"][0]["test_acc"]
    assert node.rounds[0].arrived == ("node-0",) and node.rounds[0].asked == 1
    assert results.summary["mean_acc"] == raw["summary"]["mean_acc"]
    assert results.accuracy_by_round()["node-0"] == [raw["nodes"][0]["rounds"][0]["test_acc"]]
    assert p2pfl.Results.load(tmp_path / "run") == results
    with pytest.raises(KeyError, match="no node 'node-7'"):
        results.node("node-7")
    with pytest.raises(FileNotFoundError, match="no results.json"):
        p2pfl.Results.load(tmp_path)


def test_run_from_inside_a_running_event_loop_and_from_a_dict(tmp_path: Path) -> None:
    raw = read_raw(write_tiny(tmp_path, nodes=2, rounds=1, samples=40, algorithm="local"))

    async def notebook_cell() -> tuple[p2pfl.Results, p2pfl.Results]:
        blocking = p2pfl.run(raw, out=tmp_path / "a")  # a plain call, while this loop runs
        awaited = await p2pfl.run_async(raw, out=tmp_path / "b")
        return blocking, awaited

    a, b = asyncio.run(notebook_cell())
    assert a.ok and b.ok
    assert [n.final_test_acc for n in a.nodes] == [n.final_test_acc for n in b.nodes]  # same seed, same run


def test_compare_returns_rows_by_seed(tmp_path: Path) -> None:
    scenario = write_tiny(tmp_path, nodes=2, rounds=1, samples=40)
    comparison = p2pfl.compare(scenario, ["local", "fedavg"], seeds=[0], out=tmp_path / "cmp")
    assert list(comparison.rows) == ["local", "fedavg"]
    assert [len(runs) for runs in comparison.rows.values()] == [1, 1]
    assert comparison.rows["fedavg"][0].algorithm == "fedavg"
    assert set(comparison.mean_acc()) == {"local", "fedavg"}
    assert p2pfl.Comparison.load(tmp_path / "cmp") == comparison
