"""The compare report's accuracy-against-bytes figure: one point per row that moved bytes."""

from __future__ import annotations

from pathlib import Path

from p2pfl.report.compare_figures import _accuracy_against_bytes, bytes_points


def _run(total_mib: float, nodes: int, final: float, aggregated: float) -> dict:
    return {"total_bytes": int(total_mib * 2**20), "nodes": nodes, "final": final, "final_aggregated": aggregated}


def test_each_row_is_its_mib_per_node_and_accuracies_over_seeds(tmp_path: Path) -> None:
    rows = {"local": [_run(0, 10, 0.9, 0.9)],
            "fedavg": [_run(100, 10, 0.8, 0.6), _run(120, 10, 0.82, 0.62)],
            "fedavg[topk]": [_run(2, 10, 0.79, 0.55), _run(2, 10, 0.81, 0.57)]}
    points = bytes_points(rows)
    assert set(points) == {"fedavg", "fedavg[topk]"}  # Local moved nothing: no point on a log axis
    assert points["fedavg"] == ([10.0, 12.0], [0.8, 0.82], [0.6, 0.62])
    assert points["fedavg[topk]"][0] == [0.2, 0.2]
    path = _accuracy_against_bytes(rows, tmp_path)
    assert path is not None and path.name == "accuracy_vs_bytes.png" and path.stat().st_size > 10_000
    assert _accuracy_against_bytes({"local": rows["local"]}, tmp_path / "none") is None
