"""The look every report figure shares: matplotlib without a display, series styles, saving."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
import numpy as np  # noqa: E402

from p2pfl.core.scoring import overlap_matrix  # noqa: E402

PHASE_COLOURS = {"train": "#1f77b4", "privacy": "#9467bd", "evaluate": "#2ca02c", "publish": "#ff7f0e",
                 "exchange": "#d62728", "aggregate": "#17becf"}


def label_overlap(ground_truth: Mapping[str, Any]) -> np.ndarray:
    """Σ_c min(p_i(c), p_j(c)) between the nodes' train label distributions."""
    counts = np.array([n["train_class_counts"] for n in ground_truth["nodes"]], dtype=float)
    return overlap_matrix(counts / np.maximum(counts.sum(1, keepdims=True), 1))


LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def series_style(i: int) -> dict[str, Any]:
    """Per-series line style and marker, so that series with equal values stay distinguishable."""
    return {"linestyle": LINESTYLES[i % len(LINESTYLES)], "marker": MARKERS[i % len(MARKERS)], "alpha": 0.85,
            "markersize": 4 + 2 * (i % 3)}


# Above this many nodes a per-node figure draws the spread over nodes instead of one line each:
# a hundred lines and a hundred-entry legend show nothing.
MAX_NODE_SERIES = 12


def plot_nodes(ax: plt.Axes, series: Sequence[tuple[str, Sequence[tuple[int, float | None]]]]) -> None:
    """One line per node, (label, [(round, value)]); with more than MAX_NODE_SERIES nodes, the mean
    over nodes per round with the bands holding the middle half and the middle 80 % of them."""
    if len(series) <= MAX_NODE_SERIES:
        for i, (label, points) in enumerate(series):
            ax.plot([r for r, _ in points], [v for _, v in points], label=label, **series_style(i))
        return
    by_round: dict[int, list[float]] = defaultdict(list)
    for _, points in series:
        for r, v in points:
            if v is not None:
                by_round[r].append(float(v))
    rounds = sorted(by_round)
    values = [np.asarray(by_round[r]) for r in rounds]
    for (low, high), alpha in (((10, 90), 0.15), ((25, 75), 0.3)):
        ax.fill_between(rounds, [np.percentile(v, low) for v in values], [np.percentile(v, high) for v in values],
                        color="#1f77b4", alpha=alpha, linewidth=0, label=f"{low}th to {high}th percentile of nodes")
    ax.plot(rounds, [v.mean() for v in values], color="#1f77b4", label=f"mean of {len(series)} nodes")


def node_label(results: Mapping[str, Any], node: Mapping[str, Any]) -> str:
    """`node-0 (mnist)` where the node has a domain; `node-0 {3, 7}` where the partition gave it a class set."""
    if node.get("domain"):
        return f"{node['id']} ({node['domain']})"
    truth = {str(n.get("index")): n for n in (results.get("ground_truth") or {}).get("nodes", [])}
    classes = truth.get(str(node.get("index")), {}).get("classes")
    if classes and len(classes) <= 4:
        return f"{node['id']} {{{', '.join(map(str, classes))}}}"
    return node["id"]


def round_axis(ax: plt.Axes) -> None:
    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def protocol_panels(axes: Sequence[plt.Axes], ylabel: str, prefix: str) -> None:
    """Titles, round axes, grid and legend of a figure's two panels: the model after local
    training (left) and right after aggregation (right)."""
    axes[0].set_title(f"{prefix}after local training")
    axes[1].set_title(f"{prefix}after aggregation")
    for ax in axes:
        round_axis(ax)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(ylabel)
    axes[1].legend(fontsize=7)


def save_figure(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


