"""Issue 67, item 1: a robust rule the topology cannot feed is refused at launch with one line that
names the rule, f, what a node gets and the smallest topology that works; `fallback = true` is the
explicit opt-in, named in the summary line; a fallback at run time is counted in the summary."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from p2pfl.errors import ConfigError
from p2pfl.scenario.results import active_defences, fallback_warning, fell_back
from p2pfl.scenario.schema import scenario_from_dict

QUICKSTART = Path(__file__).resolve().parents[2] / "scenarios" / "quickstart.toml"


def _raw(nodes: int, topology: str, **params: object) -> dict:
    return {"name": "robust", "nodes": nodes, "rounds": 1, "data": {"dataset": "mnist"},
            "runtime": {"topology": topology}, "algorithm": {"name": "fedavg", "params": params}}


@pytest.mark.slow
def test_the_quickstarts_four_nodes_with_krum_are_refused_at_launch_in_one_line(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "p2pfl", "run", str(QUICKSTART), "--out", str(tmp_path / "run"),
                           "--set", 'algorithm.params.aggregation="krum"'], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for named in ("algorithm.params.aggregation", "krum", "byzantine = 1", "needs 5 models", "gives a node 4",
                  "5 nodes", "fallback = true"):
        assert named in lines[0], (named, lines[0])
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("rule,f,nodes,topology,suggested", [
    ("bulyan", 1, 10, "ring", "regular:6"),      # 4f + 3 = 7 models: 6 peers
    ("multi_krum", 2, 12, "regular:4", "regular:6"),  # 2f + 3 = 7
    ("krum", 1, 5, "ring", "full"),               # 5 models on 5 nodes: only the full graph
])
def test_the_error_names_the_smallest_topology_that_works_and_that_topology_is_taken(
        rule: str, f: int, nodes: int, topology: str, suggested: str) -> None:
    with pytest.raises(ConfigError) as info:
        scenario_from_dict(_raw(nodes, topology, aggregation=rule, byzantine=f))
    assert info.value.field == "algorithm.params.aggregation" and f'"{suggested}"' in str(info.value)
    scenario_from_dict(_raw(nodes, suggested, aggregation=rule, byzantine=f))  # what it suggests launches


def test_fallback_is_the_explicit_opt_in_and_the_summary_line_names_it() -> None:
    scenario = scenario_from_dict(_raw(4, "full", aggregation="krum", fallback=True))
    assert "own model where too few models arrive" in active_defences(scenario.to_dict())
    assert "own model where too few models arrive" not in active_defences(
        scenario_from_dict(_raw(6, "full", aggregation="krum")).to_dict())
    with pytest.raises(ConfigError, match="fallback"):
        scenario_from_dict(_raw(4, "full", aggregation="median", fallback=True))


def test_a_fallback_at_run_time_is_counted_in_the_summary(tmp_path: Path) -> None:
    from .helpers import build_in_process, run_in_process, write_tiny

    nodes, _ = build_in_process(write_tiny(tmp_path, nodes=3, rounds=2, samples=40), tmp_path / "run",
                                ('algorithm.params.aggregation="krum"', "algorithm.params.fallback=true"))
    results, _, _ = run_in_process(nodes, None)
    assert [r["status"] for r in results] == ["ok"] * 3
    counted = fell_back(results)
    assert counted["node_rounds"] == 6 and set(counted["nodes"]) == {"node-0", "node-1", "node-2"}
    assert "krum needs 5 models, had 3" in counted["reason"]
    assert "fell back in 6 of 6 node-rounds" in fallback_warning(counted, 6)
