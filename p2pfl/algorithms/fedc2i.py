"""FedC2I: aggregation by client-level and class-level leave-one-out influence
(Tan, Long, Jiang, Zhang, "Influence-Oriented Personalized Federated Learning").

Each node shares its body and head; after the round's local training it downloads both
parts from every peer and, on one random batch of its own training data, computes the
client-level influence λ (one weight per model) and the class-level influence Λ (one
weight per model and class). The new body is Σ λᵢ θᵢ, the new head's row c is
Σ Λ^{i,c} φ_{i,c}. The math lives in `p2pfl.core.influence`; ALGORITHMS.md settles the
paper's typos. "At the start of round r+1" in the paper is `aggregate` at the end of round
r here, on the peers' round-r models; the next fit starts from the aggregate.

Choices this file makes (scenario parameters where they matter):

* `gamma` = 5, the paper's best on its data; γ = 0 is uniform averaging. The paper picks one γ
  for the run on validation data; `p2pfl compare` does the same with a row
  `fedc2i[gamma=0.5|1|2|5|10]`. `gamma = "auto"` is this project's extension: each node chooses
  γ every round from `gamma_grid` (default {0.5, 1, 2, 5, 10}, the paper's grid) on its own
  validation split. The leave-one-out losses do not depend
  on γ, so they are computed once; each γ's aggregate is built from them and scored on the
  node's validation split (accuracy, then loss; on a tie the earlier γ of the grid), and the
  best is kept. Recorded per round as `gamma`. A node without validation data uses 5.
* `influence_batch` = 64 samples drawn without replacement from the node's training split
  with the node's RNG, once per round and shared by λ and Λ (Algorithm 1 samples one batch).
  The paper does not give its size; a node with fewer samples uses all of them.
* The set P of models is the node's own plus every peer whose body AND head arrived (the
  newest version of each): λ and Λ index the same models. Their versions may differ
  under `accept_stale`; that is harmless, since a peer's body is only ever combined with
  the node's own head (λ) and a peer's head with the node's own body (Λ).
* Λ's losses use the node's own body before aggregation (ALGORITHMS.md), in every variant.
* `influence_chunk` (default unset: all M leave-one-out bodies in one vmap call) evaluates
  the M bodies in vmap chunks of that many models. On one CPU thread with LeNet and a batch
  of 64, the single call is 1.4-2x slower than chunks of 1-2 (the M-fold activations leave
  the cache and convolutions become grouped ones); `benchmarks/influence.py` measures it.
  The numbers do not depend on it.
* `variant`, the paper's ablations (Table 3):
  - "full": body by λ, head by Λ;
  - "-lambda": client level only, λ for the whole model (body and head);
  - "Lambda/l": class level only, body kept local; only heads are shared and fetched,
    since nothing else is used;
  - "Lambda/g": class level only, body averaged by training-sample count over P.
* A NaN or infinite leave-one-out loss (a diverged model) gives no usable weighting: the
  node logs it, records `influence_error` and keeps its own model for that round.
* Per round: `lambda_self` (λ of the own model) and `Lambda_self` (mean over classes of
  the own model's Λ row) in results.json; artefacts "lambda" {"peers", "values", "losses"}
  and "Lambda" {"peers", "values" (M×C), "losses"}, peers listed own id first then sorted.
"""

from __future__ import annotations

from typing import Any

import torch

from p2pfl.algorithms import register
from p2pfl.algorithms.common import average_part_by_count, latest_parts
from p2pfl.core.influence import (
    LeaveOneOutInfluence, InfluenceError, class_influence, client_influence, combine_heads, combine_states, eval_features,
    State, influence_weights,
)
from p2pfl.models import load_part, part_state

from p2pfl.runtime.strategy import Fetch, PeerModel, RoundContext, Strategy

VARIANTS = ("full", "-lambda", "Lambda/l", "Lambda/g")
GAMMA_GRID = (0.5, 1.0, 2.0, 5.0, 10.0)  # the paper's validation grid
DEFAULT_GAMMA = 5.0


@register
class FedC2I(Strategy):
    name = "fedc2i"
    shared_parts = ("body", "head")

    def __init__(
        self, gamma: float | str = DEFAULT_GAMMA, influence_batch: int = 64, variant: str = "full",
        influence_chunk: int | None = None, gamma_grid: list[float] | None = None,
    ) -> None:
        if gamma != "auto" and (isinstance(gamma, bool) or not isinstance(gamma, (int, float))
                                or not 0 <= gamma < float("inf")):
            raise ValueError(f"gamma must be a finite number >= 0 or \"auto\", got {gamma!r}")
        grid = GAMMA_GRID if gamma_grid is None else gamma_grid
        if (not isinstance(grid, (list, tuple)) or not grid
                or not all(isinstance(g, (int, float)) and not isinstance(g, bool) and 0 <= g < float("inf") for g in grid)):
            raise ValueError(f"gamma_grid must be a non-empty list of finite numbers >= 0, got {gamma_grid!r}")
        if gamma_grid is not None and gamma != "auto":
            raise ValueError("gamma_grid is only used with gamma = \"auto\"")
        if isinstance(influence_batch, bool) or not isinstance(influence_batch, int) or influence_batch < 1:
            raise ValueError(f"influence_batch must be an integer >= 1, got {influence_batch!r}")
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if influence_chunk is not None and (
            isinstance(influence_chunk, bool) or not isinstance(influence_chunk, int) or influence_chunk < 1
        ):
            raise ValueError(f"influence_chunk must be an integer >= 1 or unset, got {influence_chunk!r}")
        self.auto_gamma = gamma == "auto"
        self.gamma = DEFAULT_GAMMA if self.auto_gamma else float(gamma)
        self.gamma_grid = tuple(float(g) for g in grid)
        self.influence_batch = influence_batch
        self.variant = variant
        self.influence_chunk = influence_chunk
        self._scores: dict[str, float] = {}  # this round's, for peer_scores
        # Λ/l uses no peer body: sharing and fetching it would only cost bytes.
        self.parts: tuple[str, ...] = ("head",) if variant == "Lambda/l" else ("body", "head")
        self.shared_parts = self.parts

    @property
    def uses_lambda(self) -> bool:
        return self.variant in ("full", "-lambda")

    @property
    def uses_class_lambda(self) -> bool:
        return self.variant != "-lambda"

    def configure_fetch(self, ctx: RoundContext) -> list[Fetch]:
        return [Fetch(peer, part) for peer in ctx.peers for part in self.parts]

    # ---- aggregation ------------------------------------------------------------------------
    def members(self, ctx: RoundContext, arrived: list[PeerModel]) -> list[tuple[str, dict[str, PeerModel]]]:
        """Peers with every needed part, sorted by id: [(peer, {part: newest PeerModel})]."""
        by_part = {part: {m.sender: m for m in latest_parts(arrived, part)} for part in self.parts}
        complete = set.intersection(*(set(found) for found in by_part.values()))
        return [(peer, {part: by_part[part][peer] for part in self.parts}) for peer in sorted(complete)]

    def draw_batch(self, ctx: RoundContext) -> tuple[torch.Tensor, torch.Tensor]:
        train = ctx.data.train
        n = len(train.y)
        index = ctx.rng.choice(n, size=min(self.influence_batch, n), replace=False)
        index_t = torch.as_tensor(index, dtype=torch.long)
        return train.x[index_t], train.y[index_t]

    def aggregate(self, ctx: RoundContext, arrived: list[PeerModel]) -> None:
        self._scores = {}
        members = self.members(ctx, arrived)
        peers = [ctx.node_id] + [peer for peer, _ in members]
        ctx.artefacts.record("aggregated_from", peers[1:])
        if not members:
            # M = 1: every weighted sum over the own model alone is the own model.
            self._record(ctx, peers, *self._alone(ctx))
            return
        if len(ctx.data.train.y) == 0:
            ctx.log(f"{ctx.node_id}: FedC2I needs training data for its influence batch; keeping the own model")
            return
        model = ctx.model
        heads = [part_state(model, "head")] + [parts["head"].tensors for _, parts in members]
        bodies = ([part_state(model, "body")] + [parts["body"].tensors for _, parts in members]
                  if "body" in self.parts else [])
        x, y = self.draw_batch(ctx)
        try:
            lam = (client_influence(model, bodies, heads[0], x, y, self.gamma, chunk_size=self.influence_chunk)
                   if self.uses_lambda else None)
            # Features of the own body before any aggregation, computed once for all M·C losses.
            class_lam = (class_influence(eval_features(model.body, x), heads, y, self.gamma)
                         if self.uses_class_lambda else None)
        except InfluenceError as exc:
            ctx.log(f"{ctx.node_id}: FedC2I influence failed ({exc}); keeping the own model this round")
            ctx.artefacts.record("influence_error", str(exc))
            return

        if self.auto_gamma and len(ctx.data.val.y):
            gamma = self._choose_gamma(ctx, members, bodies, heads, lam, class_lam)
            lam, class_lam = (None if w is None else LeaveOneOutInfluence(influence_weights(w.losses, gamma), w.losses)
                              for w in (lam, class_lam))
            ctx.artefacts.record("gamma", gamma)
        elif self.auto_gamma:
            ctx.artefacts.record("gamma", self.gamma)  # no validation data to choose with
        self._apply(ctx, members, bodies, heads, lam, class_lam)
        self._record(ctx, peers, lam, class_lam)

    def _apply(self, ctx: RoundContext, members: list[tuple[str, dict[str, PeerModel]]], bodies: list[State],
               heads: list[State], lam: LeaveOneOutInfluence | None, class_lam: LeaveOneOutInfluence | None) -> None:
        new: dict[str, torch.Tensor] = {}
        if lam is not None:  # "full" and "-lambda": body by λ
            new.update(combine_states(bodies, lam.weights))
        if class_lam is not None:  # every variant but "-lambda": head rows by Λ
            new.update(combine_heads(heads, class_lam.weights))
        elif lam is not None:  # "-lambda": λ for the head too
            new.update(combine_states(heads, lam.weights))
        load_part(ctx.model, new)
        if self.variant == "Lambda/g":
            average_part_by_count(ctx, "body", [parts["body"] for _, parts in members])

    def _choose_gamma(self, ctx: RoundContext, members: list[tuple[str, dict[str, PeerModel]]], bodies: list[State],
                      heads: list[State], lam: LeaveOneOutInfluence | None,
                      class_lam: LeaveOneOutInfluence | None) -> float:
        """The γ of the grid whose aggregate scores best on the validation split; the model is
        left as it was."""
        start = {k: v.detach().clone() for k, v in ctx.model.state_dict().items()}
        scores = {}
        try:
            for gamma in self.gamma_grid:
                trial = [None if w is None else LeaveOneOutInfluence(influence_weights(w.losses, gamma), w.losses)
                         for w in (lam, class_lam)]
                self._apply(ctx, members, bodies, heads, *trial)
                acc, loss = ctx.trainer.evaluate(ctx.model, ctx.data.val)
                scores[gamma] = (acc, -loss)
                ctx.model.load_state_dict(start)  # own parts in `bodies`/`heads` are views of these tensors
        finally:
            ctx.model.load_state_dict(start)
        return max(scores, key=lambda g: scores[g])  # the first of the grid among equals

    def _alone(self, ctx: RoundContext) -> tuple[LeaveOneOutInfluence | None, LeaveOneOutInfluence | None]:
        lam = LeaveOneOutInfluence(torch.ones(1, dtype=torch.float64), None) if self.uses_lambda else None
        class_lam = (LeaveOneOutInfluence(torch.ones(1, ctx.model.num_classes, dtype=torch.float64), None)
                     if self.uses_class_lambda else None)
        return lam, class_lam

    def peer_scores(self, ctx: RoundContext) -> dict[str, float]:
        """This round's influence weight of each peer aggregated: λ, or Λ averaged over classes
        where the variant has no λ."""
        return dict(self._scores)

    def _record(self, ctx: RoundContext, peers: list[str], lam: LeaveOneOutInfluence | None, class_lam: LeaveOneOutInfluence | None) -> None:
        weights = (lam.weights if lam is not None else class_lam.weights.mean(dim=1) if class_lam is not None
                   else None)
        self._scores = {} if weights is None else {p: float(w) for p, w in zip(peers[1:], weights[1:].tolist())}
        sink = ctx.artefacts
        if lam is not None:
            sink.record("lambda_self", float(lam.weights[0]))
            sink.save("lambda", _payload(peers, lam))
        if class_lam is not None:
            sink.record("Lambda_self", float(class_lam.weights[0].mean()))
            sink.save("Lambda", _payload(peers, class_lam))


def _payload(peers: list[str], influence: LeaveOneOutInfluence) -> dict[str, Any]:
    return {
        "peers": peers,
        "values": influence.weights.tolist(),
        "losses": None if influence.losses is None else influence.losses.tolist(),
    }
