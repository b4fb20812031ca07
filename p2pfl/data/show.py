"""`show`: a printable table of a partition plus a PNG (samples per domain, per-node class histogram)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .partition import assign, load_pool, node_ground_truth
from .spec import DataSpec, validate_num_nodes


def _ranges(cs: list[int]) -> str:
    """[0,1,2,5,7,8] -> '0-2,5,7-8'."""
    out, i = [], 0
    while i < len(cs):
        j = i
        while j + 1 < len(cs) and cs[j + 1] == cs[j] + 1:
            j += 1
        out.append(str(cs[i]) if i == j else f"{cs[i]}-{cs[j]}")
        i = j + 1
    return ",".join(out) or "-"


def _table(spec: DataSpec, gt: dict) -> str:
    k = gt["num_classes"]
    show_counts = k <= 20
    head = ["node", "domain", "train", "val", "test", "classes"] + (["train class counts"] if show_counts else [])
    rows = []
    for n in gt["nodes"]:
        dom = n["domain"]
        if dom is None and "domain_counts" in n:
            dom = "mixed(" + ",".join(f"{d}:{c}" for d, c in n["domain_counts"].items() if c) + ")"
        row = [str(n["index"]), dom or "-", str(n["n_train"]), str(n["n_val"]), str(n["n_test"]), _ranges(n["classes"])]
        if show_counts:
            row.append(" ".join(f"{c:>4d}" for c in n["train_class_counts"]))
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    title = f"dataset={spec.dataset} partition={spec.partition}"
    if spec.partition == "dirichlet":
        title += f" alpha={spec.alpha:g} min_size={spec.min_size}"
    elif spec.partition == "dirichlet_per_node":
        title += f" alpha={spec.alpha:g}"
    elif spec.partition == "pathological":
        title += f" classes_per_node={spec.classes_per_node}"
    elif spec.partition == "domain":
        title += f" nodes_per_domain={spec.nodes_per_domain}"
        if spec.domain_split == "dirichlet":
            title += f" domain_split=dirichlet alpha={spec.alpha:g}"
    if spec.samples_per_node is not None:
        title += f" samples_per_node={spec.samples_per_node}"
    title += f" nodes={len(gt['nodes'])} seed={gt['seed']} classes={k}"
    lines = [title, fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows]
    tot = [sum(n[f] for n in gt["nodes"]) for f in ("n_train", "n_val", "n_test")]
    lines.append(f"total: train={tot[0]} val={tot[1]} test={tot[2]}")
    if gt["held_out_domain"] is not None:
        lines.append(f"held-out domain {gt['held_out_domain']!r}: {gt['n_held_out']} test samples (no node has it)")
    return "\n".join(lines)


def show(spec: DataSpec, num_nodes: int, seed: int, png_path: str | Path | None) -> str:
    """Return the partition as a table string and, with `png_path`, save a PNG: a grid of
    samples per domain (one per class) and the per-node train class histogram as stacked bars."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    spec.validate()
    validate_num_nodes(spec, num_nodes)
    pool = load_pool(spec)
    a = assign(spec, pool, num_nodes, seed)
    k = pool.num_classes
    nodes_gt = node_ground_truth(spec, pool, a)
    gt = {
        "num_classes": k,
        "held_out_domain": spec.held_out_domain,
        "n_held_out": 0 if a["held_out"] is None else len(a["held_out"]),
        "seed": seed,
        "nodes": nodes_gt,
    }
    table = _table(spec, gt)
    if png_path is None:
        return table

    # --- figure
    n_dom = len(pool.domains)
    n_cols = min(k, 10)
    fig = Figure(figsize=(max(8.0, 0.45 * num_nodes + 3), 1.0 * n_dom + 4.2), dpi=110)
    FigureCanvasAgg(fig)  # render with Agg without touching pyplot's global backend
    gs = fig.add_gridspec(2, 1, height_ratios=[max(n_dom, 1) * 1.0, 3.2], hspace=0.35)
    ax_img = fig.add_subplot(gs[0])
    h, w = pool.x.shape[2], pool.x.shape[3]
    canvas = np.ones((n_dom * (h + 2), n_cols * (w + 2), 3), np.uint8) * 255
    rng = np.random.default_rng(seed)
    for r in range(n_dom):
        for c in range(n_cols):
            cand = np.nonzero((pool.d == r) & (pool.y == c))[0]
            if len(cand) == 0:
                continue
            img = pool.x[int(rng.choice(cand))]
            img = np.repeat(img, 3, axis=0) if img.shape[0] == 1 else img
            canvas[r * (h + 2) : r * (h + 2) + h, c * (w + 2) : c * (w + 2) + w] = img.transpose(1, 2, 0)
    ax_img.imshow(canvas, interpolation="nearest")
    ax_img.set_yticks([r * (h + 2) + h / 2 for r in range(n_dom)])
    ax_img.set_yticklabels(
        [d + (" (held out)" if d == spec.held_out_domain else "") for d in pool.domains]
        if spec.dataset == "digits"
        else [spec.dataset]
    )
    ax_img.set_xticks([c * (w + 2) + w / 2 for c in range(n_cols)])
    ax_img.set_xticklabels([str(c) for c in range(n_cols)])
    ax_img.set_title("samples per domain (one per class)")

    ax = fig.add_subplot(gs[1])
    counts = np.array([n["train_class_counts"] for n in nodes_gt], np.int64)  # (nodes, K)
    cmap = colormaps["tab10" if k <= 10 else ("tab20" if k <= 20 else "viridis")]
    bottom = np.zeros(num_nodes)
    xs = np.arange(num_nodes)
    for c in range(k):
        col = cmap(c if k <= 20 else c / max(k - 1, 1))
        ax.bar(xs, counts[:, c], bottom=bottom, color=col, width=0.8, label=str(c) if k <= 20 else None)
        bottom += counts[:, c]
    labels = []
    for n in nodes_gt:
        labels.append(f"{n['index']}\n{n['domain']}" if n["domain"] else str(n["index"]))
    ax.set_xticks(xs)
    ax.set_xticklabels(labels, fontsize=7 if num_nodes > 20 else 8)
    ax.set_xlabel("node")
    ax.set_ylabel("train samples")
    ax.set_title(f"per-node train class histogram ({spec.partition})")
    if k <= 20:
        ax.legend(title="class", ncol=1 if k <= 10 else 2, fontsize=7, title_fontsize=8, bbox_to_anchor=(1.01, 1), loc="upper left")
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, bbox_inches="tight")
    return table
