"""Trust over a run: what each node learnt of each peer, from its own round records.

Two kinds of evidence, kept apart:

* the strategy's own scores (`Strategy.peer_scores`: pFedSV's relevance, FedC2I's influence λ),
  averaged over the rounds it scored the peer; a peer it never scored is not judged by it;
* the runtime's, the peer's conduct: rounds it was asked and answered, arrived stale, was pulled
  back within `runtime.update_bound` (in how many rounds, on how many counts: a part's weights and
  its buffers each count, and by what factor), was refused, or stayed silent.

They answer different questions (is the peer's model of use to me; does the peer send what an
honest peer sends), so each gives its own ranking: `ranking` by the mean strategy score (by
conduct for a strategy that scores nobody, FedAvg) and `conduct_ranking` by `conduct`, the
geometric mean over the rounds it answered of the share of its update taken (1 as sent,
1/factor pulled back, 1/FAR_BOUND_FACTOR refused). Silence is counted, not held against it: a
crashed peer did nothing wrong.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from p2pfl.runtime.node.records import participated
from p2pfl.runtime.peer_claims import FAR_BOUND_FACTOR



def node_trust(rounds: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """peer -> its counts over the node's rounds, its mean strategy score (None: never scored)
    and its `conduct` (None: it never answered)."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    scores: dict[str, list[float]] = defaultdict(list)
    shortfall: dict[str, float] = defaultdict(float)  # sum over answered rounds of ln(factor)
    for record in rounds:
        if not participated(record):
            continue
        arrived, refused, silent = set(record.get("arrived", ())), set(record.get("peers_refused", {})), \
            set(record.get("silent", ()))
        stale, bounded = set(record.get("stale", ())), set(record.get("peers_bounded", {}))
        per_round = {
            "asked": arrived | refused | silent, "answered": arrived, "stale": stale, "bounded": bounded,
            "refused": refused, "silent": silent,
        }
        for what, peers in per_round.items():
            for peer in peers:
                counts[peer][what] += 1
        for peer, reasons in (record.get("peers_bounded") or {}).items():
            # a record from before each count was kept names one reason as a string
            counts[peer]["bounded_counts"] += 1 if isinstance(reasons, str) else len(reasons)
        factors = record.get("peers_bounded_factor", {})
        for peer in bounded:
            shortfall[peer] += math.log(max(float(factors.get(peer, 1.0)), 1.0))
        for peer in refused:
            shortfall[peer] += math.log(FAR_BOUND_FACTOR)
        for peer, score in record.get("peer_scores", {}).items():
            scores[peer].append(float(score))
    out: dict[str, dict[str, Any]] = {}
    for peer in sorted(set(counts) | set(scores)):
        c = counts[peer]
        judged = c["answered"] + c["refused"]
        out[peer] = {
            **{k: c[k] for k in ("asked", "answered", "stale", "bounded", "bounded_counts", "refused", "silent")},
            "conduct": math.exp(-shortfall[peer] / judged) if judged else None,
            "score": sum(scores[peer]) / len(scores[peer]) if scores[peer] else None,
            "scored": len(scores[peer]),
        }
    return out


def ranking_key(trust: Mapping[str, Mapping[str, Any]], by: str = "score") -> str:
    """`by` = "score": the strategy's mean score where it scored any peer, else conduct."""
    return "score" if by == "score" and any(t["score"] is not None for t in trust.values()) else "conduct"


def ranking(trust: Mapping[str, Mapping[str, Any]], by: str = "score") -> list[str]:
    """The peers the node judged by `ranking_key`, most trusted first; equal keys in name order."""
    key = ranking_key(trust, by)
    judged = [p for p in sorted(trust) if trust[p][key] is not None]
    return sorted(judged, key=lambda p: -trust[p][key])


def places(trust: Mapping[str, Mapping[str, Any]], by: str = "score") -> dict[str, float]:
    """Each judged peer's place in the node's ranking, 0 most trusted to 1 least; peers with
    equal keys share their places' mean (FedAvg's conduct is 1 for every honest peer: they all
    sit in the middle, none "least trusted" by its name)."""
    order, key = ranking(trust, by), ranking_key(trust, by)
    if len(order) < 2:
        return dict.fromkeys(order, 0.0)
    out: dict[str, float] = {}
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and trust[order[end + 1]][key] == trust[order[start]][key]:
            end += 1
        for peer in order[start:end + 1]:
            out[peer] = (start + end) / 2 / (len(order) - 1)
        start = end + 1
    return out


def ranked_last(trust: Mapping[str, Mapping[str, Any]], peers: Iterable[str], by: str = "score") -> bool:
    """Whether one of `peers` is this node's least trusted peer (`by` as `ranking`), strictly
    below every other it judged."""
    order, key = ranking(trust, by), ranking_key(trust, by)
    if len(order) < 2:
        return False
    return order[-1] in set(peers) and trust[order[-1]][key] < trust[order[-2]][key]


def run_trust(nodes: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """results.json's `trust`: each node's view of its peers and its ranking, and the
    federation's view of each peer (its mean place in the rankings that hold it: 0 most trusted,
    1 least). None for a run in which no node asked anyone."""
    by_node = {n["id"]: node_trust(n.get("rounds") or []) for n in nodes}
    by_node = {nid: t for nid, t in by_node.items() if t}
    if not by_node:
        return None
    held: dict[str, list[float]] = defaultdict(list)
    views: dict[str, dict[str, Any]] = {}
    for nid, trust in by_node.items():
        order = ranking(trust)
        views[nid] = {"peers": trust, "ranking": order, "conduct_ranking": ranking(trust, "conduct")}
        for peer, place in places(trust).items():
            held[peer].append(place)
    federation = {p: {"mean_place": sum(v) / len(v), "ranked_by": len(v)} for p, v in sorted(held.items())}
    return {"nodes": views, "federation": federation}


def trust_places(trust: Mapping[str, Any], ids: Sequence[str]) -> list[list[float | None]]:
    """The node × peer matrix over `ids` of places in each node's ranking (0 most trusted, 1
    least; None where the node did not judge the peer)."""
    at = {nid: i for i, nid in enumerate(ids)}
    matrix: list[list[float | None]] = [[None] * len(ids) for _ in ids]
    for nid, view in trust["nodes"].items():
        for peer, place in places(view["peers"]).items():
            if nid in at and peer in at:
                matrix[at[nid]][at[peer]] = place
    return matrix
