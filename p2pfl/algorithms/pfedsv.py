"""pFedSV: Shapley-valued coalitions with dynamic top-k downloads (Wu et al., TMC 2024).

Each round, after local training, node i downloads the k peers it finds most relevant,
plays the coalition game S = {i} u arrived with v(X) = validation accuracy of the uniform
average of the models in X (eq. 4), and uses the Shapley values twice: to update its
relevance vector (eq. 5) and as aggregation weights (eq. 6-7). The math lives in
`p2pfl.core.shapley` and `p2pfl.core.relevance`; ALGORITHMS.md settles the paper's typos.

Choices this file makes (scenario parameters where they matter):

* `alpha` (relevance EMA) is not given in the paper; 0.5 weighs this round's value and the
  history equally.
* exact Shapley values up to `exact_max_players` = 6 members (63 utility evaluations, fewer
  than R = 3|S| permutations would need), Monte Carlo above.
* dynamic k: see `p2pfl.core.relevance.next_k`; the first round downloads `k` peers.
* a peer whose last fetch failed (`ctx.unreachable`) yields its slot for one round.
* `reprobe` (default 0, the paper): download this many extra non-selected peers per round,
  the longest unscored first. Without it a peer is re-scored only while it is in the top k,
  so once every peer is scored nonzero a node downloads only positive ones, and one whose
  peers all scored negative (an unlucky early round is enough) stays local for good.
* variant "D+C" (Section V-A): bodies are averaged by sample count over `body_peers` peers
  (all by default; a fresh random subset each round otherwise; 0 keeps the body local), then
  the node's validation features are computed once with that averaged body, and the
  coalition game runs over heads only: v(X) is one head average and one matrix product.
  Distances in eq. 6 are then distances between heads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from p2pfl.algorithms import register
from p2pfl.algorithms.common import ModelPool, average_part_by_count, latest_parts
from p2pfl.core.relevance import ema_update, next_k, pfedsv_weights, stalest, top_k
from p2pfl.core.shapley import ShapleyResult, shapley_values
from p2pfl.core.influence import weighted_average
from p2pfl.models import body_features, load_part, part_state
from p2pfl.runtime.strategy import Fetch, PeerModel, RoundContext, Strategy

VARIANTS = ("full", "D+C")
EMPTY_UTILITIES = ("zero", "chance")


class HeadGame:
    """Coalition utilities over linear heads on fixed features: v(X) = acc(feats @ mean W_X^T + mean b_X)."""

    def __init__(self, features: torch.Tensor, labels: torch.Tensor, heads: Sequence[dict[str, torch.Tensor]]) -> None:
        self.features = features
        self.labels = labels.to(features.device)
        self.weight = torch.stack([h["head.weight"] for h in heads]).to(features.device)
        self.bias = torch.stack([h["head.bias"] for h in heads]).to(features.device)

    @torch.no_grad()
    def accuracy(self, members: Sequence[int]) -> float:
        if len(self.labels) == 0:
            return float("nan")
        index = torch.as_tensor(list(members), dtype=torch.long)
        logits = torch.addmm(self.bias[index].mean(0), self.features, self.weight[index].mean(0).T)
        return int((logits.argmax(1) == self.labels).sum()) / len(self.labels)


@register
class PFedSV(Strategy):
    name = "pfedsv"

    def __init__(
        self,
        k: int = 5,
        k_min: int = 1,
        alpha: float = 0.5,
        permutations: int | None = None,
        exact_max_players: int = 6,
        empty_utility: str = "zero",
        truncation: float | None = None,
        variant: str = "full",
        body_peers: int | None = None,
        reprobe: int = 0,
    ) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if k_min < 1:
            raise ValueError(f"k_min must be >= 1, got {k_min}")
        if not 0.0 <= alpha < 1.0:
            raise ValueError(f"alpha must be in [0, 1), got {alpha}")
        if permutations is not None and permutations < 1:
            raise ValueError(f"permutations must be >= 1, got {permutations}")
        if exact_max_players < 0:
            raise ValueError(f"exact_max_players must be >= 0, got {exact_max_players}")
        if empty_utility not in EMPTY_UTILITIES:
            raise ValueError(f"empty_utility must be one of {EMPTY_UTILITIES}, got {empty_utility!r}")
        if truncation is not None and truncation < 0:
            raise ValueError(f"truncation must be >= 0, got {truncation}")
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if body_peers is not None and body_peers < 0:
            raise ValueError(f"body_peers must be >= 0, got {body_peers}")
        if reprobe < 0:
            raise ValueError(f"reprobe must be >= 0, got {reprobe}")
        self.k = k
        self.k_min = k_min
        self.alpha = alpha
        self.permutations = permutations
        self.exact_max_players = exact_max_players
        self.empty_utility = empty_utility
        self.truncation = truncation
        self.variant = variant
        self.body_peers = body_peers
        self.reprobe = reprobe
        # Only the parts this variant downloads are worth encoding each round.
        self.shared_parts = ("full",) if variant == "full" else ("body", "head")
        self.relevance: dict[str, float] = {}
        self.seen: set[str] = set()
        self.last_scored: dict[str, int] = {}

    # ---- state ------------------------------------------------------------------------------
    def _ensure_peers(self, ctx: RoundContext) -> None:
        for peer in ctx.peers:
            self.relevance.setdefault(peer, 0.0)

    def setup(self, ctx: RoundContext) -> None:
        self._ensure_peers(ctx)

    def peer_scores(self, ctx: RoundContext) -> dict[str, float]:
        """The relevance (eq. 5) of every peer scored so far; a peer never downloaded is not judged."""
        return {p: self.relevance[p] for p in self.last_scored if p in self.relevance}

    def state_dict(self) -> dict[str, Any]:
        return {"relevance": dict(self.relevance), "seen": sorted(self.seen), "last_scored": dict(self.last_scored),
                "k": self.k}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.relevance = {str(p): float(v) for p, v in state["relevance"].items()}
        self.seen = {str(p) for p in state["seen"]}
        self.last_scored = {str(p): int(r) for p, r in state["last_scored"].items()}
        self.k = int(state["k"])

    def _empty_value(self, ctx: RoundContext) -> float:
        return 0.0 if self.empty_utility == "zero" else 1.0 / ctx.model.num_classes

    # ---- downloads --------------------------------------------------------------------------
    def configure_fetch(self, ctx: RoundContext) -> list[Fetch]:
        self._ensure_peers(ctx)
        scores = {p: self.relevance[p] for p in ctx.peers}
        chosen = top_k(scores, self.k, rng=ctx.rng, seen=self.seen, avoid=ctx.unreachable)
        if self.reprobe:
            rest = [p for p in ctx.peers if p not in chosen]
            chosen += stalest(rest, self.last_scored, self.reprobe, rng=ctx.rng, avoid=ctx.unreachable)
        ctx.artefacts.record("requested", chosen)
        if self.variant == "full":
            return [Fetch(p, "full") for p in chosen]
        fetches = [Fetch(p, "head") for p in chosen]
        return fetches + [Fetch(p, "body") for p in self._body_peers(ctx)]

    def _body_peers(self, ctx: RoundContext) -> list[str]:
        peers = list(ctx.peers)
        if self.body_peers is None or self.body_peers >= len(peers):
            return peers
        picked = ctx.rng.choice(len(peers), size=self.body_peers, replace=False)
        return [peers[i] for i in sorted(picked)]

    # ---- aggregation ------------------------------------------------------------------------
    def aggregate(self, ctx: RoundContext, arrived: list[PeerModel]) -> None:
        self._ensure_peers(ctx)
        if len(ctx.data.val.y) == 0:
            ctx.log(f"{ctx.node_id}: pFedSV needs validation data; keeping the own model")
        if self.variant == "full":
            members = latest_parts(arrived, "full")
            result, weights = self._full_round(ctx, members)
        else:
            average_part_by_count(ctx, "body", latest_parts(arrived, "body"))  # the common feature extractor
            members = latest_parts(arrived, "head")
            result, weights = self._head_round(ctx, members)
        senders = [m.sender for m in members]
        used_k = self.k
        if result is not None:
            self.relevance = ema_update(self.relevance, {j: result.values[j] for j in senders}, self.alpha)
            self.seen |= set(senders)
            self.last_scored.update(dict.fromkeys(senders, ctx.round))
        self.k = next_k({p: self.relevance[p] for p in ctx.peers}, self.k_min)
        self._record(ctx, senders, result, weights, used_k)

    def _game(
        self, ctx: RoundContext, players: list[str], accuracy: Callable[[list[int]], float]
    ) -> ShapleyResult:
        index = {p: i for i, p in enumerate(players)}

        def utility(coalition: frozenset) -> float:
            value = accuracy(sorted(index[p] for p in coalition))
            return 0.0 if np.isnan(value) else value

        return shapley_values(
            players, utility, rng=ctx.rng, permutations=self.permutations,
            exact_max_players=self.exact_max_players, empty_value=self._empty_value(ctx),
            truncation=self.truncation,
        )

    def _weights(self, players: list[str], result: ShapleyResult, distances: np.ndarray) -> np.ndarray:
        return pfedsv_weights([result.values[p] for p in players], distances, own_index=0)

    def _full_round(self, ctx: RoundContext, members: list[PeerModel]) -> tuple[ShapleyResult | None, np.ndarray | None]:
        if not members:
            return None, None
        states = [part_state(ctx.model, "full")] + [m.tensors for m in members]
        players = [ctx.node_id] + [m.sender for m in members]
        pool = ModelPool(ctx.model, states)
        result = self._game(ctx, players, lambda idx: pool.evaluate(idx, ctx.data.val)[0])
        weights = self._weights(players, result, pool.distances(0))
        if weights.sum() > 0:
            load_part(ctx.model, weighted_average(states, weights.tolist()))
        return result, weights

    def _head_round(self, ctx: RoundContext, members: list[PeerModel]) -> tuple[ShapleyResult | None, np.ndarray | None]:
        if not members:
            return None, None
        heads = [part_state(ctx.model, "head")] + [m.tensors for m in members]
        players = [ctx.node_id] + [m.sender for m in members]
        # All coalitions share the node's (averaged) body: one forward pass for the whole game.
        game = HeadGame(body_features(ctx.model, ctx.data.val.x), ctx.data.val.y, heads)
        result = self._game(ctx, players, game.accuracy)
        weights = self._weights(players, result, ModelPool(ctx.model, heads).distances(0))
        if weights.sum() > 0:
            load_part(ctx.model, weighted_average(heads, weights.tolist()))
        return result, weights

    def _record(
        self, ctx: RoundContext, senders: list[str], result: ShapleyResult | None,
        weights: np.ndarray | None, used_k: int,
    ) -> None:
        sink = ctx.artefacts
        sink.save("relevance", {"peers": list(ctx.peers), "values": [self.relevance[p] for p in ctx.peers]})
        if result is not None and weights is not None:
            players = [ctx.node_id] + senders
            sink.save("shapley", {
                "peers": players,
                "values": [result.values[p] for p in players],
                "weights": weights.tolist(),
                "method": result.method,
            })
            sink.record("self_weight", float(weights[0]))
            sink.record("kept_own_model", bool(weights.sum() == 0))
        sink.record("k", used_k)
        sink.record("k_next", self.k)
        sink.record("downloaded", senders)
        sink.record("utility_evaluations", 0 if result is None else result.evaluations)
