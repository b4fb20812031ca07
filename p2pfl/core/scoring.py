"""Score a node's relevance vector against the partition's ground truth.

Under a pathological split the truly relevant peers are those sharing a class with the node,
a binary truth: precision and recall of "peers with positive relevance". Under Dirichlet
alpha = 0.1 almost every pair shares some class, so the graded truth is the overlap of label
distributions, sum_c min(p_i(c), p_j(c)), scored by Spearman rank correlation with the
relevance vector and by precision among the top-k.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping, Sequence

import numpy as np

Peer = Hashable


def label_distribution(labels: Sequence[int] | np.ndarray, num_classes: int) -> np.ndarray:
    """p(c): the fraction of `labels` equal to c, for c < num_classes (zeros for no labels)."""
    y = np.asarray(labels, dtype=np.int64).reshape(-1)
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes})")
    counts = np.bincount(y, minlength=num_classes).astype(np.float64)
    return counts / counts.sum() if counts.sum() > 0 else counts


def label_overlap(p: Sequence[float] | np.ndarray, q: Sequence[float] | np.ndarray) -> float:
    """sum_c min(p(c), q(c)): 1 for equal distributions, 0 for disjoint supports."""
    return float(np.minimum(np.asarray(p, dtype=np.float64), np.asarray(q, dtype=np.float64)).sum())


def overlap_matrix(distributions: Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
    """Pairwise `label_overlap` of the rows (nodes x classes)."""
    p = np.asarray(distributions, dtype=np.float64)
    return np.minimum(p[:, None, :], p[None, :, :]).sum(axis=2)


def sharing_peers(
    own: Sequence[float] | np.ndarray, peers: Mapping[Peer, Sequence[float] | np.ndarray], min_overlap: float = 0.0
) -> set[Peer]:
    """Peers whose label overlap with `own` exceeds `min_overlap` (0: sharing any class)."""
    return {j for j, q in peers.items() if label_overlap(own, q) > min_overlap}


def precision_recall(predicted: Collection[Peer], truth: Collection[Peer]) -> tuple[float, float]:
    """(|P & T| / |P|, |P & T| / |T|); nan where the denominator is empty."""
    p, t = set(predicted), set(truth)
    hit = len(p & t)
    precision = hit / len(p) if p else float("nan")
    recall = hit / len(t) if t else float("nan")
    return precision, recall


def precision_at_k(scores: Mapping[Peer, float], truth: Collection[Peer], k: int) -> float:
    """Fraction of the k highest-scored peers that are in `truth` (ties: mapping order)."""
    if k <= 0:
        return float("nan")
    ranked = sorted(scores, key=lambda j: -float(scores[j]))[:k]
    t = set(truth)
    return sum(1 for j in ranked if j in t) / len(ranked)


def rankdata(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """1-based ranks, ties given their average rank (as scipy.stats.rankdata 'average')."""
    a = np.asarray(values, dtype=np.float64)
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(a.size, dtype=np.float64)
    sorted_a = a[order]
    start = 0
    while start < a.size:
        end = start
        while end + 1 < a.size and sorted_a[end + 1] == sorted_a[start]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2.0 + 1.0
        start = end + 1
    return ranks


def spearman(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Spearman rank correlation (Pearson on average ranks); nan if either side is constant."""
    rx, ry = rankdata(x), rankdata(y)
    if rx.size != ry.size:
        raise ValueError("x and y must have equal length")
    if rx.size < 2:
        return float("nan")
    dx, dy = rx - rx.mean(), ry - ry.mean()
    denom = float(np.sqrt((dx**2).sum() * (dy**2).sum()))
    return float((dx * dy).sum() / denom) if denom > 0 else float("nan")


def score_relevance(
    relevance: Mapping[Peer, float],
    own: Sequence[float] | np.ndarray,
    peers: Mapping[Peer, Sequence[float] | np.ndarray],
    *,
    k: int | None = None,
    min_overlap: float = 0.0,
) -> dict[str, float]:
    """All scores of one node's relevance vector against label distributions.

    `relevance` and `peers` are keyed by the same peer ids; `k` defaults to the number of
    truly relevant peers (precision at k is then R-precision).
    """
    ids = [j for j in relevance if j in peers]
    truth = sharing_peers(own, {j: peers[j] for j in ids}, min_overlap)
    positive = {j for j in ids if relevance[j] > 0}
    precision, recall = precision_recall(positive, truth)
    overlaps = [label_overlap(own, peers[j]) for j in ids]
    kk = len(truth) if k is None else k
    return {
        "precision": precision,
        "recall": recall,
        "precision_at_k": precision_at_k({j: relevance[j] for j in ids}, truth, kk),
        "k": float(kk),
        "spearman": spearman([relevance[j] for j in ids], overlaps),
        "relevant": float(len(truth)),
        "positive": float(len(positive)),
    }
