"""The membership timeline of a run with churn: a node-by-round grid of who was live, sat out or
absent, with each join, departure, crash, restart, revocation and flapping member's step out and
back marked where it happened."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from p2pfl.report.style import round_axis, save_figure

ABSENT, SAT_OUT, LIVE = 0, 1, 2
MARKERS = {"joined": ("o", "tab:green"), "left": ("s", "tab:purple"), "crashed": ("X", "tab:red"),
           "restarted": ("^", "tab:blue"), "revoked": ("D", "black"),
           "stepped_out": ("v", "tab:orange"), "stepped_back": ("P", "tab:olive")}
MAX_ROWS = 60  # more nodes than this: the rows are the nodes with events first, then the others in order


def plot_membership(results: Mapping[str, Any], out: Path) -> Path | None:
    timeline = results.get("membership")
    if not timeline:
        return None
    ids = [n["id"] for n in results["nodes"]]
    eventful = [i for i in ids if any(i in entry.get(e, ()) for entry in timeline for e in MARKERS)]
    rows = (eventful + [i for i in ids if i not in eventful])[:MAX_ROWS] if len(ids) > MAX_ROWS else ids
    row_of = {nid: k for k, nid in enumerate(rows)}
    grid = np.full((len(rows), len(timeline)), ABSENT)
    for c, entry in enumerate(timeline):
        for nid in entry["live"]:
            if nid in row_of:
                grid[row_of[nid], c] = SAT_OUT if nid in entry["sat_out"] else LIVE
    fig, (ax, counts) = plt.subplots(2, 1, figsize=(9, 2.2 + 0.16 * len(rows)),
                                     gridspec_kw={"height_ratios": [max(len(rows), 4), 4]}, sharex=True)
    rounds = [entry["round"] for entry in timeline]
    ax.imshow(grid, aspect="auto", interpolation="nearest", cmap=ListedColormap(["white", "#c9d9ec", "#5b8fc9"]),
              vmin=0, vmax=2, extent=(rounds[0] - 0.5, rounds[-1] + 0.5, len(rows) - 0.5, -0.5))
    for kind, (marker, colour) in MARKERS.items():
        points = [(entry["round"], row_of[nid]) for entry in timeline for nid in entry.get(kind, ()) if nid in row_of]
        if points:
            xs, ys = zip(*points)
            # Not clipped: a marker on the first or last row or round is drawn whole, over the frame.
            ax.scatter(xs, ys, marker=marker, color=colour, s=36, label=kind, zorder=3, edgecolors="white", linewidths=0.5,
                       clip_on=False)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows, fontsize=6 if len(rows) > 20 else 8)
    shown = "" if len(rows) == len(ids) else f" ({len(rows)} of {len(ids)} nodes: those with events first)"
    ax.set_title(f"{results['scenario']['name']}: membership{shown}")
    handles = [Patch(color="#5b8fc9", label="live"), Patch(color="#c9d9ec", label="sat out"),
               Patch(facecolor="white", edgecolor="grey", label="absent")]
    ax.legend(handles=handles + ax.get_legend_handles_labels()[0], fontsize=7, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    counts.step(rounds, [len(entry["live"]) for entry in timeline], where="mid", color="#5b8fc9")
    counts.set_ylabel("live nodes")
    counts.set_ylim(bottom=0)
    counts.grid(alpha=0.3)
    round_axis(counts)
    return save_figure(fig, out / "membership.png")
