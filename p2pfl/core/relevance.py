"""Relevance bookkeeping and aggregation weights for pFedSV and FedFomo.

Pure numpy over peer ids; the strategies supply Shapley values, losses and model distances.

pFedSV (Wu et al., TMC 2024), as ALGORITHMS.md settles it:

* relevance EMA r_j <- alpha r_j + (1 - alpha) SV_j for the peers in this round's coalition
  (eq. 5); every other peer keeps its score (init 0);
* downloads: the top-k peers by relevance, ties broken at random, unseen peers ranked before
  seen ones of equal score (a scored null player is no reason to skip an untried peer);
* dynamic k (`next_k`): every positively relevant peer, plus up to `k_min` peers at
  relevance 0 (unseen, or scored with no effect either way) while any remain. Counting the
  exploration slots on top of the positive peers (rather than k = max(#positive, k_min))
  keeps scanning at `k_min` new peers per round even once some relevant peers are known;
  with k_min = k that is what the paper's discovery bound ceil((n-m-1)/k) + 1 needs (under
  plain top-k, known relevant peers take the slots and an adversarial draw exceeds the
  bound: see tests/core/test_relevance.py). Counting scored zeros with the unseen keeps an
  uninformative round (every coalition at the same accuracy, all values 0) from ending
  discovery. Once every peer is shown helpful or harmful, k = #positive, the paper's
  "converge to k = m".
* weights (eq. 6-7): w_j = max(SV_j, 0) / ||theta_i - theta_j||, the node's own distance
  being the mean distance to the other coalition members; normalised; all zero -> keep own.

FedFomo (Zhang et al., ICLR 2021): w_n = max(L(theta_old) - L(theta_n), 0) / ||theta_n - theta_old||,
normalised; downloads by accumulated weight with epsilon-greedy exploration.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping, Sequence

import numpy as np

Peer = Hashable


def ema_update(
    relevance: Mapping[Peer, float], shapley: Mapping[Peer, float], alpha: float
) -> dict[Peer, float]:
    """A new relevance dict with r_j <- alpha r_j + (1 - alpha) SV_j for every j in `shapley` (eq. 5)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    updated = dict(relevance)
    for peer, value in shapley.items():
        updated[peer] = alpha * updated.get(peer, 0.0) + (1.0 - alpha) * float(value)
    return updated


def rank_peers(
    scores: Mapping[Peer, float],
    *,
    rng: np.random.Generator | None = None,
    seen: Collection[Peer] | None = None,
    avoid: Collection[Peer] = (),
    order: Sequence[Peer] | None = None,
) -> list[Peer]:
    """All peers, best first: by score, then unseen before seen, then a tie order.

    The tie order is `order` when given (earlier wins: tests use it to play adversarial
    draws), else a fresh random permutation from `rng`, else the mapping's order. Peers in
    `avoid` (their last fetch failed) go last, so their slots pass to the next candidates
    for one round and they are retried afterwards.
    """
    peers = list(scores)
    if order is not None:
        position = {p: i for i, p in enumerate(order)}
        missing = [p for p in peers if p not in position]
        if missing:
            raise ValueError(f"tie order misses peers {missing}")
        tie = [position[p] for p in peers]
    elif rng is not None:
        tie = list(rng.permutation(len(peers)))
    else:
        tie = list(range(len(peers)))
    avoided = set(avoid)
    seen_set = set(seen) if seen is not None else set()
    keyed = sorted(
        range(len(peers)),
        key=lambda i: (peers[i] in avoided, -float(scores[peers[i]]), peers[i] in seen_set, tie[i]),
    )
    return [peers[i] for i in keyed]


def top_k(
    scores: Mapping[Peer, float],
    k: int,
    *,
    rng: np.random.Generator | None = None,
    seen: Collection[Peer] | None = None,
    avoid: Collection[Peer] = (),
    order: Sequence[Peer] | None = None,
) -> list[Peer]:
    """The first `k` of `rank_peers` (all peers if k exceeds their number)."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    return rank_peers(scores, rng=rng, seen=seen, avoid=avoid, order=order)[:k]


def next_k(relevance: Mapping[Peer, float], k_min: int) -> int:
    """Dynamic k: all positively relevant peers plus up to `k_min` at relevance 0 while any remain.

    Unseen peers are at 0 (the initial relevance), so they are the exploration candidates;
    `rank_peers(..., seen=...)` orders them before scored zeros.
    """
    if k_min < 1:
        raise ValueError(f"k_min must be >= 1, got {k_min}")
    positive = sum(1 for r in relevance.values() if r > 0)
    undecided = sum(1 for r in relevance.values() if r == 0)
    return positive + min(k_min, undecided)


def stalest(
    candidates: Collection[Peer],
    last_scored: Mapping[Peer, int],
    n: int,
    *,
    rng: np.random.Generator | None = None,
    avoid: Collection[Peer] = (),
) -> list[Peer]:
    """Up to `n` of `candidates`, never-scored first, then the longest unscored (ties at random).

    The paper's mechanism re-scores a peer only when it downloads it, and once every peer is
    scored it downloads only positive ones: a peer that looked harmful once (an unlucky early
    round) is never looked at again, and a node that found no positive peer goes local for
    good. Re-probing the stalest peers is the bounded exploration that lets scores recover.
    """
    avoided = set(avoid)
    pool = [p for p in candidates if p not in avoided]
    tie = rng.permutation(len(pool)) if rng is not None else np.arange(len(pool))
    order = sorted(range(len(pool)), key=lambda i: (last_scored.get(pool[i], -1), tie[i]))
    return [pool[i] for i in order[: max(n, 0)]]


def epsilon_greedy(
    scores: Mapping[Peer, float],
    m: int,
    epsilon: float,
    rng: np.random.Generator,
    *,
    avoid: Collection[Peer] = (),
) -> list[Peer]:
    """`m` peers: each slot is, with probability epsilon, a uniformly random remaining peer,
    else the best remaining one by score (ties at random). Peers in `avoid` go last."""
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
    ranking = rank_peers(scores, rng=rng, avoid=avoid)
    avoided = set(avoid)
    chosen: list[Peer] = []
    for _ in range(min(m, len(ranking))):
        remaining = [p for p in ranking if p not in chosen]
        reachable = [p for p in remaining if p not in avoided] or remaining
        if rng.random() < epsilon:
            chosen.append(reachable[int(rng.integers(len(reachable)))])
        else:
            chosen.append(remaining[0])
    return chosen


def _normalise(raw: np.ndarray) -> np.ndarray:
    total = float(raw.sum())
    if not np.isfinite(total) or total <= 0.0:
        return np.zeros_like(raw)
    return raw / total


def pfedsv_weights(
    shapley: Sequence[float], distances: Sequence[float], *, own_index: int = 0, floor: float = 1e-12
) -> np.ndarray:
    """eq. 6 normalised: w_j = max(SV_j, 0) / d_j, d_own = mean of the other members' distances.

    The printed ||theta_i - theta_i|| in eq. 6 is a typo (it would divide by zero); the mean
    distance puts the own model on the scale of its coalition. Distances are floored so that
    a peer identical to the node does not divide by zero. Returns all zeros when no member
    has a positive value: the caller keeps its own model.
    """
    sv = np.asarray(shapley, dtype=np.float64)
    d = np.asarray(distances, dtype=np.float64).copy()
    if sv.shape != d.shape or sv.ndim != 1:
        raise ValueError("shapley and distances must be 1-d and of equal length")
    others = np.delete(d, own_index)
    d[own_index] = float(others.mean()) if others.size else 1.0
    return _normalise(np.maximum(sv, 0.0) / np.maximum(d, floor))


def fedfomo_weights(
    base_loss: float, losses: Sequence[float], distances: Sequence[float], *, floor: float = 1e-12
) -> np.ndarray:
    """w_n = max(L(theta_old) - L(theta_n), 0) / ||theta_n - theta_old||, normalised (zeros if none helps).

    A model at distance 0 from theta_old is theta_old itself: its loss gain is 0, so is its weight.
    """
    gain = base_loss - np.asarray(losses, dtype=np.float64)
    d = np.asarray(distances, dtype=np.float64)
    if gain.shape != d.shape:
        raise ValueError("losses and distances must have equal length")
    raw = np.where(d > floor, np.maximum(gain, 0.0) / np.maximum(d, floor), 0.0)
    return _normalise(raw)
