"""Score the relevance (pFedSV) or affinity (FedFomo) vectors a run found against the partition.

A node never sees the ground truth; this is computed after the run from its artefacts.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from typing import Any

import numpy as np

from p2pfl.core.scoring import score_relevance

SCORED_ARTEFACTS = ("relevance", "affinity")
METRICS = ("precision", "recall", "precision_at_k", "spearman")


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.fmean(values) if values else None


def score_run(artefacts: Mapping[str, Mapping[str, Mapping[int, Any]]], ground_truth: Mapping[str, Any],
              node_ids: list[str]) -> dict[str, Any] | None:
    name = next((n for n in SCORED_ARTEFACTS if n in artefacts), None)
    if name is None:
        return None
    counts = np.array([n["train_class_counts"] for n in ground_truth["nodes"]], dtype=float)
    dists = counts / np.maximum(counts.sum(1, keepdims=True), 1)
    by_id = dict(zip(node_ids, dists))
    per_node: dict[str, list[dict[str, Any]]] = {}
    per_round: dict[int, dict[str, list[float]]] = {}
    for node, rounds in artefacts[name].items():
        for r, value in sorted(rounds.items()):
            relevance = dict(zip(value["peers"], value["values"]))
            peers = {p: by_id[p] for p in relevance if p in by_id}
            scores = score_relevance(relevance, by_id[node], peers)
            per_node.setdefault(node, []).append({"round": r, **scores})
            for metric in METRICS:
                per_round.setdefault(r, {m: [] for m in METRICS})[metric].append(scores[metric])
    return {
        "vector": name,
        "truth": "peers sharing at least one training class (binary); label-distribution overlap (spearman)",
        "per_round": [{"round": r, **{m: _mean(v[m]) for m in METRICS}} for r, v in sorted(per_round.items())],
        "per_node": per_node,
    }
