"""Per-node figures stay readable: one line per node for a few nodes, the spread over nodes for many."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from p2pfl.report import MAX_NODE_SERIES, plot_nodes, representative_nodes  # noqa: E402
from p2pfl.runtime.timing import PHASES  # noqa: E402


def _series(nodes: int) -> list[tuple[str, list[tuple[int, float | None]]]]:
    rng = np.random.default_rng(0)
    # Node 0 sits out round 2 (no value), as a node under partial participation records none.
    return [(f"node-{i}", [(r, None if (i, r) == (0, 2) else float(rng.random())) for r in (1, 2, 3)])
            for i in range(nodes)]


def test_a_few_nodes_get_a_line_each() -> None:
    fig, ax = plt.subplots()
    plot_nodes(ax, _series(3))
    assert [line.get_label() for line in ax.get_lines()] == ["node-0", "node-1", "node-2"]
    plt.close(fig)


def test_many_nodes_get_their_mean_and_percentile_bands() -> None:
    series = _series(MAX_NODE_SERIES + 8)
    fig, ax = plt.subplots()
    plot_nodes(ax, series)
    (mean_line,) = ax.get_lines()
    assert mean_line.get_label() == f"mean of {len(series)} nodes"
    expected = [np.mean([v for _, points in series for r, v in points if r == k and v is not None]) for k in (1, 2, 3)]
    assert list(mean_line.get_xdata()) == [1, 2, 3]
    assert mean_line.get_ydata() == pytest.approx(expected)
    bands = [c.get_label() for c in ax.collections]
    assert bands == ["10th to 90th percentile of nodes", "25th to 75th percentile of nodes"]
    plt.close(fig)


def _timed_node(index: int, seconds_per_phase: float) -> dict:
    time = {f"{phase}_s": seconds_per_phase for phase in PHASES}
    return {"id": f"node-{index}", "rounds": [{"round": 1, "time": time}, {"round": 2, "time": time}]}


def test_round_time_of_a_few_nodes_shows_every_node() -> None:
    nodes = [_timed_node(i, 1.0 + i) for i in range(3)]
    assert [label for label, _ in representative_nodes(nodes)] == ["node-0", "node-1", "node-2"]


def test_round_time_of_many_nodes_shows_the_nodes_at_percentiles_of_round_time() -> None:
    # 101 nodes whose round time is a shuffled 0..100, so the node at percentile q takes q seconds.
    order = np.random.default_rng(1).permutation(101)
    nodes = [_timed_node(i, float(order[i]) / len(PHASES)) for i in range(101)]
    shown = representative_nodes(nodes)
    totals = [sum(n["rounds"][0]["time"].values()) for _, n in shown]
    assert totals == pytest.approx([0, 10, 25, 50, 75, 90, 100])
    assert shown[0][0] == f"node-{int(np.argmin(order))} (fastest)"
    assert shown[3][0].endswith("(median)") and shown[-1][0].endswith("(slowest)")
    assert shown[1][0].endswith("(10th pct)")


@pytest.mark.slow
def test_a_lan_merge_and_the_launcher_write_the_same_results(tmp_path: Path) -> None:
    """One writer (`p2pfl.scenario.results.write_results`) for both: a LAN run's merged file used
    to lack `relevance_scores` and `data_fingerprint`."""
    import json
    import shutil

    from p2pfl.report import merge_node_results
    from p2pfl.scenario.launcher import run_scenario
    from tests.runtime.helpers import write_tiny

    results, code = run_scenario(write_tiny(tmp_path, nodes=3, rounds=1, samples=40, algorithm="pfedsv"),
                                 tmp_path / "run", progress=False, quiet=True)
    assert code == 0
    lan = tmp_path / "lan"  # what an operator copies together from the hosts: each node's files
    (lan / "nodes").mkdir(parents=True)
    shutil.copy(tmp_path / "run" / "scenario.json", lan / "scenario.json")
    for path in (tmp_path / "run" / "nodes").glob("*.result.json"):
        shutil.copy(path, lan / "nodes" / path.name)
    shutil.copytree(tmp_path / "run" / "artefacts", lan / "artefacts")
    assert merge_node_results(lan)
    merged = json.loads((lan / "results.json").read_text())
    assert set(merged) == set(results) and "relevance_scores" in merged and "data_fingerprint" in merged
    assert merged["relevance_scores"] == json.loads(json.dumps(results["relevance_scores"]))


def test_a_diverging_scale_is_centred_on_zero() -> None:
    """Issue 33, item 7: relevance drawn with coolwarm put 0 on the blue side when values were skewed."""
    import numpy as np

    from p2pfl.report.run_figures import diverging_limits

    assert diverging_limits(np.array([[0.05, -0.3], [np.nan, 0.1]])) == {"vmin": -0.3, "vmax": 0.3}
    assert diverging_limits(np.array([[0.0, np.nan]])) == {"vmin": -1.0, "vmax": 1.0}
