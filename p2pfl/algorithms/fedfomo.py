"""FedFomo (Zhang et al., ICLR 2021), the pairwise baseline pFedSV compares against.

Weights from first-order model optimisation on the node's validation split:
w_n = max(L(theta_old) - L(theta_n), 0) / ||theta_n - theta_old||, normalised, and the new
model is theta_old + sum_n w_n (theta_n - theta_old) = sum_n w_n theta_n.

Mapping onto this runtime's round (fit -> publish -> fetch -> aggregate):

* theta_old is the model this round started from (`ctx.round_start`, the previous
  personalised aggregate), and the candidates are the node's freshly trained model plus the
  downloaded ones, as in FedFomo, where a client weighs its own latest upload like any other
  model. Without a round start (hand-built contexts) theta_old is the current model, whose
  weight is then 0 by construction.
* If no candidate lowers the validation loss, the node keeps its trained model.
* Downloads: the top-`m` peers by accumulated weight (the affinity vector, every peer at 0
  to start, so round 1 draws at random), each slot replaced by a uniformly random peer with
  probability epsilon_t = max(epsilon - epsilon_decay (t - 1), 0). epsilon = 0.3 and a decay
  of 0.05 per round are the values of the authors' released commands.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from p2pfl.algorithms import register
from p2pfl.algorithms.common import ModelPool, latest_parts
from p2pfl.core.influence import weighted_average
from p2pfl.core.relevance import epsilon_greedy, fedfomo_weights
from p2pfl.models import load_part, part_state
from p2pfl.runtime.strategy import Fetch, PeerModel, RoundContext, Strategy


@register
class FedFomo(Strategy):
    name = "fedfomo"
    shared_parts = ("full",)

    def __init__(self, m: int = 5, epsilon: float = 0.3, epsilon_decay: float = 0.05) -> None:
        if m < 1:
            raise ValueError(f"m must be >= 1, got {m}")
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
        if epsilon_decay < 0:
            raise ValueError(f"epsilon_decay must be >= 0, got {epsilon_decay}")
        self.m = m
        self.epsilon = epsilon
        self.epsilon_decay = epsilon_decay
        self.affinity: dict[str, float] = {}

    def _ensure_peers(self, ctx: RoundContext) -> None:
        for peer in ctx.peers:
            self.affinity.setdefault(peer, 0.0)

    def setup(self, ctx: RoundContext) -> None:
        self._ensure_peers(ctx)

    def state_dict(self) -> dict[str, Any]:
        return {"affinity": dict(self.affinity)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.affinity = {str(p): float(v) for p, v in state["affinity"].items()}

    def exploration(self, round_: int) -> float:
        return max(self.epsilon - self.epsilon_decay * (max(round_, 1) - 1), 0.0)

    def configure_fetch(self, ctx: RoundContext) -> list[Fetch]:
        self._ensure_peers(ctx)
        eps = self.exploration(ctx.round)
        scores = {p: self.affinity[p] for p in ctx.peers}
        chosen = epsilon_greedy(scores, self.m, eps, ctx.rng, avoid=ctx.unreachable)
        ctx.artefacts.record("requested", chosen)
        ctx.artefacts.record("explore_epsilon", eps)
        return [Fetch(p, "full") for p in chosen]

    def aggregate(self, ctx: RoundContext, arrived: list[PeerModel]) -> None:
        self._ensure_peers(ctx)
        members = latest_parts(arrived, "full")
        senders = [m.sender for m in members]
        own = part_state(ctx.model, "full")
        base = {k: ctx.round_start[k] for k in own} if ctx.round_start else own
        candidates = [own] + [m.tensors for m in members]
        weights = np.zeros(len(candidates))
        if members:
            pool = ModelPool(ctx.model, [base] + candidates)
            losses = [pool.evaluate([i], ctx.data.val)[1] for i in range(pool.size)]
            if not np.isnan(losses[0]):
                weights = fedfomo_weights(losses[0], losses[1:], pool.distances(0)[1:])
            for sender, w in zip(senders, weights[1:]):
                self.affinity[sender] = self.affinity.get(sender, 0.0) + float(w)
            if weights.sum() > 0:
                load_part(ctx.model, weighted_average(candidates, weights.tolist()))
        sink = ctx.artefacts
        sink.save("affinity", {"peers": list(ctx.peers), "values": [self.affinity[p] for p in ctx.peers]})
        sink.save("fomo_weights", {"peers": [ctx.node_id] + senders, "values": weights.tolist()})
        sink.record("downloaded", senders)
        sink.record("self_weight", float(weights[0]) if weights.sum() > 0 else 1.0)
