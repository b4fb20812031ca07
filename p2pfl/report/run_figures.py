"""Figures of one run folder (results.json and artefacts): accuracy, bytes, time, influence, ε."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np

from p2pfl.report.membership_figure import plot_membership
from p2pfl.report.trust_figures import plot_trust, trust_table
from p2pfl.report.style import (MAX_NODE_SERIES, PHASE_COLOURS, label_overlap, node_label, plot_nodes,
                                protocol_panels, round_axis, save_figure)
from p2pfl.runtime.run_folder import load_artefacts
from p2pfl.runtime.timing import PHASES, compute_fraction
from p2pfl.runtime.node.records import TEST_ACC, TEST_ACC_AGGREGATED, accuracies


def plot_accuracy(results: Mapping[str, Any], out: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, key in zip(axes, (TEST_ACC, TEST_ACC_AGGREGATED)):
        plot_nodes(ax, [(node_label(results, n), list(zip((r["round"] for r in n["rounds"]), accuracies(n["rounds"], key))))
                        for n in results["nodes"]])
    protocol_panels(axes, "accuracy", prefix="test accuracy ")
    fig.suptitle(f"{results['scenario']['name']}: {results['algorithm']}")
    return save_figure(fig, out / "accuracy.png")


def plot_loss(results: Mapping[str, Any], out: Path) -> Path:
    """Training loss (the last local epoch's mean) and test loss of the model a node deploys."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title in zip(axes, ("train_loss", "test_loss"), ("training loss (last local epoch)", "test loss")):
        plot_nodes(ax, [(node_label(results, n), [(r["round"], r.get(key)) for r in n["rounds"]])
                        for n in results["nodes"]])
        ax.set_title(title)
        round_axis(ax)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("cross-entropy")
    axes[1].legend(fontsize=7)
    fig.suptitle(f"{results['scenario']['name']}: {results['algorithm']}")
    return save_figure(fig, out / "loss.png")


def plot_bytes(results: Mapping[str, Any], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    plot_nodes(ax, [(node_label(results, n), [(r["round"], r["param_bytes_received"] / 2**20) for r in n["rounds"]])
                     for n in results["nodes"]])
    round_axis(ax)
    ax.set_ylabel("parameter MiB received")
    ax.set_ylim(bottom=0)  # from zero: a constant download is a flat line, not noise zoomed in
    series = {tuple(r["param_bytes_received"] for r in n["rounds"]) for n in results["nodes"]}
    same = f"; all {len(results['nodes'])} nodes alike" if len(series) == 1 and len(results["nodes"]) > 1 else ""
    values = {v for s in series for v in s}
    if len(values) == 1:  # one number says it
        each = next(iter(values))
        amount = f"{each / 2**20:.2f} MiB" if each >= 2**20 else f"{each / 2**10:.1f} KiB"
        ax.text(0.5, 0.5, f"{amount} per node, every round", transform=ax.transAxes, ha="center", fontsize=11)
    ax.set_title(f"download per node per round ({results['algorithm']}{same})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, out / "bytes_per_round.png")


def _mean_phase_seconds(node: Mapping[str, Any], phase: str) -> float:
    return float(np.mean([r["time"][f"{phase}_s"] for r in node["rounds"] if r.get("time")]))


# The ranks a figure of many nodes shows, as percentiles of the nodes' mean round time.
REPRESENTATIVE_PERCENTILES = (0, 10, 25, 50, 75, 90, 100)
_PERCENTILE_NAMES = {0: "fastest", 50: "median", 100: "slowest"}


def representative_nodes(nodes: Sequence[Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any]]]:
    """(label, node) for the bars of the per-node panel. Up to MAX_NODE_SERIES nodes: every node,
    labelled by its id. More: the nodes at REPRESENTATIVE_PERCENTILES of the mean round time
    (nearest rank, fastest first), so that a hundred nodes give seven bars that show the spread."""
    if len(nodes) <= MAX_NODE_SERIES:
        return [(n["id"], n) for n in nodes]
    by_total = sorted(nodes, key=lambda n: sum(_mean_phase_seconds(n, phase) for phase in PHASES))
    chosen = []
    for q in REPRESENTATIVE_PERCENTILES:
        node = by_total[round(q / 100 * (len(by_total) - 1))]
        chosen.append((f"{node['id']} ({_PERCENTILE_NAMES.get(q, f'{q}th pct')})", node))
    return chosen


def plot_round_time(results: Mapping[str, Any], out: Path) -> Path | None:
    """Where each node's round time goes (mean seconds per round, stacked by phase), and per round.
    With more than MAX_NODE_SERIES nodes the per-node panel shows the nodes at a few percentiles
    of the round time (`representative_nodes`); the per-round panel always averages over all."""
    nodes = [n for n in results["nodes"] if any(r.get("time") for r in n.get("rounds", []))]
    if not nodes:
        return None
    shown = representative_nodes(nodes)
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, max(3.5, 0.35 * len(shown) + 1.5)))
    y = np.arange(len(shown))
    offset = np.zeros(len(shown))
    for phase in PHASES:
        seconds = np.array([_mean_phase_seconds(n, phase) for _, n in shown])
        left.barh(y, seconds, left=offset, color=PHASE_COLOURS[phase], label=phase)
        offset += seconds
    for i, (_, n) in enumerate(shown):
        fraction = compute_fraction(n["rounds"])
        if fraction is not None:
            left.text(offset[i], i, f" {fraction:.0%} compute", va="center", fontsize=7)
    left.set_yticks(y, [label for label, _ in shown], fontsize=7)
    left.invert_yaxis()
    left.set_xlabel("seconds per round (mean over rounds)")
    left.set_title("per node" if len(shown) == len(nodes) else f"{len(nodes)} nodes: fastest to slowest")
    left.set_xlim(0, offset.max() * 1.25)
    rounds = sorted({r["round"] for n in nodes for r in n["rounds"] if r.get("time")})
    bottom = np.zeros(len(rounds))
    for phase in PHASES:
        seconds = np.array([
            np.mean([r["time"][f"{phase}_s"] for n in nodes for r in n["rounds"] if r["round"] == k and r.get("time")])
            for k in rounds
        ])
        right.bar(rounds, seconds, bottom=bottom, color=PHASE_COLOURS[phase], label=phase)
        bottom += seconds
    round_axis(right)
    right.set_ylabel("seconds (mean over nodes)")
    right.set_title("per round")
    right.grid(axis="y", alpha=0.3)
    fraction = results["summary"].get("compute_fraction")
    share = "" if fraction is None else f", compute fraction {fraction:.2f}"
    fig.suptitle(f"{results['scenario']['name']}: {results['algorithm']}, where round time goes{share}")
    handles, labels = right.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(PHASES), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(out / "round_time.png", dpi=110)
    plt.close(fig)
    return out / "round_time.png"


def _matrix_by_round(values: Mapping[str, Mapping[int, Any]], node_ids: list[str], round_: int) -> np.ndarray:
    """Rows: nodes; columns: peers (by id); NaN where a node holds no value for that peer."""
    index = {nid: i for i, nid in enumerate(node_ids)}
    mat = np.full((len(node_ids), len(node_ids)), np.nan)
    for node, by_round in values.items():
        v = by_round.get(round_)
        if v is None or node not in index:
            continue
        for peer, x in zip(v["peers"], v["values"]):
            if peer in index:
                mat[index[node], index[peer]] = x
    return mat


DIVERGING = ("coolwarm", "RdBu_r", "bwr")


def diverging_limits(mat: np.ndarray) -> dict[str, float]:
    """vmin and vmax symmetric about 0, so that 0 sits at the colour scale's neutral middle."""
    finite = mat[np.isfinite(mat)]
    largest = float(np.abs(finite).max()) if finite.size else 1.0
    largest = largest if largest > 0 else 1.0
    return {"vmin": -largest, "vmax": largest}


def _heatmaps(values: Mapping[str, Mapping[int, Any]], node_ids: list[str], title: str, path: Path,
              extra: tuple[str, np.ndarray] | None = None, cmap: str = "viridis",
              tick_labels: list[str] | None = None) -> Path:
    rounds = sorted({r for by_round in values.values() for r in by_round})
    shown = sorted({rounds[0], rounds[len(rounds) // 2], rounds[-1]})
    panels = [(f"round {r}", _matrix_by_round(values, node_ids, r)) for r in shown]
    if extra is not None:
        panels.append(extra)
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.8))
    axes = np.atleast_1d(axes)
    short = tick_labels or [nid.replace("node-", "") for nid in node_ids]
    for ax, (name, mat) in zip(axes, panels):
        # A diverging scale is centred on 0 (a Shapley value or relevance of 0 is neither colour).
        im = ax.imshow(mat, cmap=cmap, **(diverging_limits(mat) if cmap in DIVERGING else {}))
        ax.set_title(name)
        ax.set_xticks(range(len(short)), short, fontsize=7, rotation=90 if tick_labels else 0)
        ax.set_yticks(range(len(short)), short, fontsize=7)
        ax.set_xlabel("peer")
        ax.set_ylabel("node")
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle(title)
    return save_figure(fig, path)


def plot_influence_matrices(values: Mapping[str, Mapping[int, Any]], out: Path) -> Path:
    """Λ (models × classes) of every node at its last round."""
    nodes = sorted(values)
    fig, axes = plt.subplots(1, len(nodes), figsize=(3.2 * len(nodes), 3.4))
    axes = np.atleast_1d(axes)
    for ax, node in zip(axes, nodes):
        last = values[node][max(values[node])]
        mat = np.array(last["values"])
        im = ax.imshow(mat, cmap="magma", aspect="auto")
        ax.set_title(f"{node}: Λ, round {max(values[node])}", fontsize=9)
        ax.set_yticks(range(len(last["peers"])), [p.replace("node-", "") for p in last["peers"]], fontsize=7)
        ax.set_xlabel("class")
        ax.set_ylabel("model")
        fig.colorbar(im, ax=ax, fraction=0.046)
    return save_figure(fig, out / "class_influence.png")


def plot_coordinator_weights(results: Mapping[str, Any], out: Path) -> Path | None:
    coord = results.get("coordinator")
    if not coord or not coord.get("rounds"):
        return None
    rounds = [r["round"] for r in coord["rounds"]]
    nodes = sorted({k for r in coord["rounds"] for k in r["weights"]})
    domains = {n["id"]: n.get("domain") for n in results["nodes"]}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for nid in nodes:
        axes[0].plot(rounds, [r["weights"].get(nid, np.nan) for r in coord["rounds"]], marker="o",
                     label=f"{nid} ({domains.get(nid)})" if domains.get(nid) else nid)
    axes[0].set_title("aggregation weights ω per round")
    round_axis(axes[0])
    axes[0].legend(fontsize=7)
    axes[0].grid(alpha=0.3)
    held = [r.get("held_out_acc") for r in coord["rounds"]]
    if any(h is not None for h in held):
        axes[1].plot(rounds, held, marker="o")
        axes[1].set_title(f"held-out domain ({coord.get('held_out_domain')}) accuracy, global model")
        round_axis(axes[1])
        axes[1].grid(alpha=0.3)
    else:
        axes[1].axis("off")
    return save_figure(fig, out / "coordinator_weights.png")


def plot_scalar_records(results: Mapping[str, Any], key: str, out: Path, ylabel: str) -> Path | None:
    series = {n["id"]: [(r["round"], r.get("strategy", {}).get(key)) for r in n["rounds"]] for n in results["nodes"]}
    if not any(v is not None for s in series.values() for _, v in s):
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    plot_nodes(ax, list(series.items()))
    round_axis(ax)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, out / f"{key}.png")


def plot_hooks(results: Mapping[str, Any], out: Path) -> Path | None:
    """hooks.png: the strategy hooks' numbers per round, one panel each (`evaluate`'s metrics,
    `fit_config`'s settings such as a learning-rate schedule), each node's line; None without any."""
    from p2pfl.report.tensorboard import hook_scalars

    series: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for node in results["nodes"]:
        for record in node.get("rounds") or []:
            for tag, value in hook_scalars(record).items():
                series.setdefault(tag, {}).setdefault(node["id"], []).append((record["round"], value))
    if not series:
        return None
    tags = sorted(series)
    fig, axes = plt.subplots(len(tags), 1, figsize=(7, 2.6 * len(tags)), sharex=True, squeeze=False)
    for ax, tag in zip(axes[:, 0], tags):
        plot_nodes(ax, [(node_label(results, n), series[tag].get(n["id"], [])) for n in results["nodes"]
                        if n["id"] in series[tag]])
        ax.set_ylabel(tag, fontsize=8)
        ax.grid(alpha=0.3)
    round_axis(axes[-1, 0])
    axes[0, 0].set_title("the strategy's hooks per round (metrics: evaluate; fit: fit_config)", fontsize=9)
    return save_figure(fig, out / "hooks.png")


def plot_relevance_scores(scores: Mapping[str, Any], out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    rounds = [r["round"] for r in scores["per_round"]]
    for metric in ("precision", "recall", "precision_at_k", "spearman"):
        ax.plot(rounds, [r[metric] for r in scores["per_round"]], marker="o", label=metric)
    round_axis(ax)
    ax.set_ylim(-1.05, 1.05)
    ax.set_title(f"{scores['vector']} vs ground truth (mean over nodes)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, out / "relevance_scores.png")


def plot_client_indices(results: Mapping[str, Any], out: Path) -> Path | None:
    """Client2Vec's Fig. 2: node x node cosine similarity of beta and of beta^f, nodes in index
    order with their domains on the axes (same-domain blocks on the diagonal are what the
    feature index should show)."""
    from p2pfl.core.client2vec import similarity_matrix

    c2v = results.get("client2vec")
    if not c2v:
        return None
    nodes = [n for n in results["nodes"] if n["id"] in c2v["indices"]]
    labels = [node_label(results, n) for n in nodes]
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5))
    for ax, key, title in ((axes[0], "indices", "β = [β^f ; β^l]"), (axes[1], "feature_indices", "β^f (feature index)")):
        mat = similarity_matrix([np.asarray(c2v[key][n["id"]]) for n in nodes])
        im = ax.imshow(mat, cmap="viridis", vmin=min(0.0, float(mat.min())), vmax=1.0)
        ax.set_title(f"cosine similarity of {title}")
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)
        ax.set_yticks(range(len(labels)), labels, fontsize=6)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle(f"Client2Vec indices ({c2v['strategy']} strategy)")
    fig.tight_layout()
    return save_figure(fig, out / "client_indices.png")


def client_index_separation(results: Mapping[str, Any], out: Path) -> Path | None:
    """`client_indices.md`: how well β^f and β separate the nodes' domains (same-domain minus
    cross-domain mean cosine, nearest neighbours); None without indices or without 2+ domains
    of which one has 2+ nodes."""
    from p2pfl.core.client2vec import group_separation

    c2v = results.get("client2vec")
    if not c2v:
        return None
    nodes = [n for n in results["nodes"] if n["id"] in c2v["indices"] and n.get("domain")]
    domains = [n["domain"] for n in nodes]
    if len(set(domains)) < 2 or len(set(domains)) == len(domains):
        return None
    lines = [f"Client2Vec indices ({c2v['strategy']} strategy), {len(nodes)} nodes in {len(set(domains))} domains",
             "", "| index | same-domain cosine | cross-domain cosine | gap | nearest neighbour in own domain |",
             "|---|---|---|---|---|"]
    for key, name in (("feature_indices", "β^f"), ("indices", "β = [β^f ; β^l]")):
        sep = group_separation([np.asarray(c2v[key][n["id"]]) for n in nodes], domains)
        lines.append(f"| {name} | {sep.same:.3f} | {sep.cross:.3f} | {sep.gap:.3f} | {sep.nearest_in_group}/{sep.nodes} |")
    path = out / "client_indices.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def plot_epsilon(results: Mapping[str, Any], out: Path) -> Path | None:
    if all(r.get("epsilon") is None for n in results["nodes"] for r in n["rounds"]):
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    plot_nodes(ax, [(n["id"], [(r["round"], r["epsilon"]) for r in n["rounds"]]) for n in results["nodes"]])
    round_axis(ax)
    ax.set_ylabel("cumulative ε")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return save_figure(fig, out / "epsilon.png")


def report_run(run_dir: Path) -> list[Path]:
    from p2pfl.scenario.results import download_health, download_warning

    results = json.loads((run_dir / "results.json").read_text())
    warning = download_warning(download_health(results["nodes"]))
    if warning is not None:  # the plots below show a run whose nodes heard from fewer peers than asked
        print(f"{run_dir}: {warning}", file=sys.stderr)
    out = run_dir / "report"
    out.mkdir(exist_ok=True)
    paths = [plot_accuracy(results, out), plot_loss(results, out), plot_bytes(results, out)]
    node_ids = [n["id"] for n in results["nodes"]]
    # Under a domain split a heatmap is read by domain: "3 mnistm" rather than "3".
    domains = [n.get("domain") for n in results["nodes"]]
    ticks = [f"{nid.replace('node-', '')} {d}" for nid, d in zip(node_ids, domains)] if all(domains) else None
    artefacts = load_artefacts(run_dir)
    if "lambda" in artefacts:
        paths.append(_heatmaps(artefacts["lambda"], node_ids, "client-level influence λ (row: node, column: model)",
                               out / "client_influence.png", tick_labels=ticks))
    if "Lambda" in artefacts:
        paths.append(plot_influence_matrices(artefacts["Lambda"], out))
    for name in ("relevance", "affinity"):
        if name in artefacts:
            truth = ("label overlap (ground truth)", label_overlap(results["ground_truth"]))
            paths.append(_heatmaps(artefacts[name], node_ids, f"{name} vectors beside the partition's label overlap",
                                   out / f"{name}.png", extra=truth, cmap="coolwarm"))
    if results.get("relevance_scores"):
        paths.append(plot_relevance_scores(results["relevance_scores"], out))
    for key, label in (("lambda_self", "λ self-weight"), ("k", "dynamic k")):
        p = plot_scalar_records(results, key, out, label)
        if p is not None:
            paths.append(p)
    for p in (plot_coordinator_weights(results, out), plot_epsilon(results, out), plot_round_time(results, out),
              plot_client_indices(results, out), client_index_separation(results, out), plot_membership(results, out),
              plot_trust(results, out), trust_table(results, out), plot_hooks(results, out)):
        if p is not None:
            paths.append(p)
    return paths


