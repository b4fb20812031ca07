"""Client2Vec (Guo et al., seed 004): client index vectors built before training, and their three uses.

Before round 1 (`setup`) every node encodes its training data with the frozen encoder pair
(`p2pfl.models.encoders`: image embedding D, label embedding L) and gets its index
beta = [beta^f ; beta^l] (`p2pfl.core.client2vec`):

* `strategy = "global"`: the node pushes one batch of 128 (D, L) pairs to the coordinator
  (kind "batch"); the coordinator half trains DSA-IGN on the union and answers with it
  (part "setup.dsa_ign"); the node computes beta over all its training samples. The batch is
  data-derived: 128 image embeddings with their exact labels (the label codes give them away),
  512 KiB per node, counted in the setup's bytes. Refused under DP-SGD.
* `index = "mean_embedding"`: the baseline index (mean D in place of beta^f); no DSA-IGN, no coordinator.
* `indices_from = "runs/x/seed{seed}/results.json"`: every node's index as an earlier run with the
  same seed and data recorded it (the ablation's rows share one index per seed; nothing is sent).

Then every node publishes its index (part "setup.index") and fetches its peers'. The training
rounds are decentralised FedAvg over `ceil(fraction * M)` peers a round (M peers), with the
three uses as switches, so the paper's ablation rows are one strategy:

* all off: the K peers are drawn uniformly at random, weights ∝ n_train (the "FedAvg" row);
  no index is built, so the row's bytes are FedAvg's alone;
* (i) `sampling`: eq. 1 draws the K peers (softmax of S / tau, exclusion window);
* (ii) `aggregation`: eq. 3 weights the cohort (prior q ∝ n_train, history gamma, heat);
* (iii) `local`: eq. 4 in local training, with weight `mu` (default 5.0 under the global
  strategy, 1.0 otherwise, as the paper's Table 1): a projection P of the body's features,
  L_orth = the mean |cos(z_P, beta^f)| over all nodes' beta^f (`local_orth = "raw"`: the
  printed |z_P B^f|, which z = 0 also minimises), and KL(logits of z || logits of z_P) through a
  second classifier; P and that classifier stay on the node. `projection = "fixed"` freezes
  P (a trainable P can zero the orthogonality term without changing z); ||P B^f|| is recorded.

Readings of the paper (cohorts, windows, zero vectors) are in `p2pfl.core.client2vec`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from p2pfl.algorithms import register
from p2pfl.algorithms.client2vec.eq4 import Eq4
from p2pfl.algorithms.client2vec.index import BATCH, Client2VecHalf, IndexBuilding, dsa_ign_config
from p2pfl.algorithms.client2vec.reuse import ReusedIndices, parse_indices, tensor_from_text, tensor_to_text
from p2pfl.core.client2vec import (
    FEATURE_MEANS,
    LOSS_TERMS,
    ORTH_MODES,
    ClientIndex,
    IndexTraining,
    aggregation_weights,
    cohort_similarity,
    draw_without_replacement,
    exclusion_window,
    sampling_probabilities,
)
from p2pfl.core.influence import weighted_average
from p2pfl.models import load_part, part_state
from p2pfl.models.encoders import check_encoder
from p2pfl.runtime.strategy import Fetch, PeerModel, RoundContext, RunResults, Strategy
from p2pfl.training.trainer import FitResult

__all__ = ["BATCH", "Client2Vec", "Client2VecHalf", "Eq4", "ReusedIndices", "parse_indices"]

STRATEGIES = ("global", "federated")
INDICES = ("client2vec", "mean_embedding")
PROJECTIONS = ("trainable", "fixed")




@register
class Client2Vec(IndexBuilding, Strategy):
    """Decentralised FedAvg over K peers a round, with Client2Vec's sampling, aggregation and local training."""

    name = "client2vec"
    coordinator = Client2VecHalf
    shared_parts = ("full",)
    reads_runs = ("indices_from",)
    setup_for_joiners = True  # a joiner takes the DSA-IGN from a neighbour (IndexBuilding.global_dsa_ign)

    def __init__(
        self,
        strategy: str = "global",
        index: str = "client2vec",
        sampling: bool = True,
        aggregation: bool = True,
        local: bool = True,
        fraction: float = 0.2,
        tau: float = 1.0,
        gamma: float = 0.5,
        heat: float = 1.0,
        mu: float | None = None,
        projection: str = "trainable",
        local_orth: str = "cosine",
        image_encoder: str = "pretrained",
        label_encoder: str = "pretrained",
        label_prompt: str = "a photo of the digit {label}",
        embed_dim: int = 512,
        d_model: int = 32,
        heads: int = 8,
        layers: int = 3,
        ff_dim: int = 256,
        dropout: float = 0.1,
        positional: bool = True,
        orth: str = "cosine",
        losses: tuple[str, ...] = LOSS_TERMS,
        index_rounds: int = 100,
        index_fraction: float = 0.1,
        index_local_epochs: int = 10,
        index_lr: float = 1e-3,
        feature_mean: str = "balanced",
        indices_from: str | RunResults | None = None,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        if index not in INDICES:
            raise ValueError(f"index must be one of {INDICES}, got {index!r}")
        if feature_mean not in FEATURE_MEANS:
            raise ValueError(f"feature_mean must be one of {FEATURE_MEANS}, got {feature_mean!r}")
        self.feature_mean = feature_mean
        if projection not in PROJECTIONS:
            raise ValueError(f"projection must be one of {PROJECTIONS}, got {projection!r}")
        if not 0 < fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {fraction}")
        if not tau > 0 or not heat > 0 or not 0 <= gamma <= 1:
            raise ValueError(f"tau > 0, heat > 0 and gamma in [0, 1] are required, got {tau}, {heat}, {gamma}")
        self.strategy, self.index_kind = strategy, index
        self.sampling, self.aggregation, self.local = bool(sampling), bool(aggregation), bool(local)
        self.fraction, self.tau, self.gamma, self.heat = float(fraction), float(tau), float(gamma), float(heat)
        self.mu = float(mu) if mu is not None else (5.0 if strategy == "global" else 1.0)
        if self.mu < 0:
            raise ValueError(f"mu must be >= 0, got {mu}")
        self.projection = projection
        if local_orth not in ORTH_MODES:
            raise ValueError(f"local_orth must be one of {ORTH_MODES}, got {local_orth!r}")
        self.local_orth = local_orth
        if self.sampling or self.aggregation or self.local:  # only a row that builds an index encodes anything
            check_encoder(image_encoder, "image", "algorithm.params.image_encoder")
            check_encoder(label_encoder, "label", "algorithm.params.label_encoder")
        self.encoders = (image_encoder, label_encoder, label_prompt)
        self.config = dsa_ign_config(embed_dim, d_model, heads, layers, ff_dim, dropout, positional, orth, losses)
        if index_rounds < 1 or not 0 < index_fraction <= 1 or index_local_epochs < 1:
            raise ValueError("index_rounds >= 1, index_fraction in (0, 1] and index_local_epochs >= 1 are required")
        self.index_rounds, self.index_fraction = int(index_rounds), float(index_fraction)
        self.local_training = IndexTraining(epochs=int(index_local_epochs), batch_size=BATCH, lr=float(index_lr))
        # Learnt in setup and across rounds.
        self.indices: dict[str, ClientIndex] = {}
        self.n_train: dict[str, int] = {}
        self.history: dict[str, float] = {}
        self.last_cohort: list[str] = []
        self.last_drawn: dict[str, int] = {}  # peer -> the last round it was downloaded
        self._eq4: Eq4 | None = None
        self._eq4_state: dict[str, torch.Tensor] | None = None  # from a checkpoint, until the next fit
        # The scenario layer reads the path (its "{seed}" set) and passes the run's results.json;
        # a plain path is kept to say what was asked for (validation builds the strategy without it).
        run = indices_from if isinstance(indices_from, RunResults) else None
        self.indices_from = (run.path if run is not None else indices_from) if self.uses_index else None
        self.reused: ReusedIndices | None = parse_indices(run) if run is not None and self.uses_index else None

    # ---- rounds ----------------------------------------------------------------------------------
    def per_round(self, ctx: RoundContext) -> int:
        return max(1, math.ceil(self.fraction * len(ctx.peers)))

    def similarity(self, cohort: list[str], candidate: str) -> float:
        known = [c for c in cohort if c in self.indices]
        if candidate not in self.indices or not known:
            return 0.0
        return cohort_similarity(self.indices, self.n_train, known, candidate)

    def configure_fetch(self, ctx: RoundContext) -> list[Fetch]:
        peers = [p for p in ctx.peers if p not in ctx.departed]
        if not peers:
            return []
        k = self.per_round(ctx)
        if self.sampling and ctx.round > 1:
            window = exclusion_window(len(peers), k)
            excluded = {p for p, r in self.last_drawn.items() if ctx.round - r <= window}
            cohort = [ctx.node_id, *self.last_cohort]
            probs = sampling_probabilities({p: self.similarity(cohort, p) for p in peers}, self.tau, excluded)
            drawn = draw_without_replacement(probs, k, ctx.rng)
            ctx.artefacts.record("sampling_probabilities", probs)
        else:  # round 1 of (i), and the FedAvg row: uniform
            drawn = sorted(ctx.rng.choice(peers, size=min(k, len(peers)), replace=False).tolist())
        for p in drawn:
            self.last_drawn[p] = ctx.round
        ctx.artefacts.record("drawn", drawn)
        return [Fetch(p, "full") for p in drawn]

    def aggregate(self, ctx: RoundContext, arrived: list[PeerModel]) -> None:
        models = [m for m in arrived if m.part == "full"]
        cohort = [ctx.node_id] + [m.sender for m in models]
        self.last_cohort = cohort[1:]
        for m in models:
            self.n_train.setdefault(m.sender, m.n_train)
        sizes = {ctx.node_id: float(len(ctx.data.train)), **{m.sender: float(m.n_train) for m in models}}
        total = sum(sizes.values())
        weights = {c: sizes[c] / total for c in cohort}  # the FedAvg row; eq. 3's prior q
        if self.aggregation:
            for i in self.indices:
                self.history[i] = self.gamma * self.history.get(i, 0.0) + self.similarity(cohort, i)
            weights = aggregation_weights(self.history, weights, self.heat)
        ctx.artefacts.record("weights", weights)
        if not models:
            return
        states = [part_state(ctx.model, "full")] + [m.tensors for m in models]
        load_part(ctx.model, weighted_average(states, [weights[c] for c in cohort]))

    def fit(self, ctx: RoundContext) -> FitResult:
        if not self.local or self.mu == 0:
            return ctx.trainer.fit(ctx.model, ctx.data.train)
        if self._eq4 is None:
            feature_indices = torch.stack([i.feature for i in self.indices.values()], dim=1)
            self._eq4 = Eq4(ctx.model, feature_indices, self.mu, trainable=self.projection == "trainable", seed=ctx.seed,
                            orth=self.local_orth)
            if self._eq4_state is not None:
                device = next(ctx.model.parameters()).device
                self._eq4.load_state_dict({k: v.to(device) for k, v in self._eq4_state.items()})
                self._eq4_state = None
        eq4 = self._eq4
        with eq4.capturing(ctx.model):
            result = ctx.trainer.fit(ctx.model, ctx.data.train, params=[*ctx.model.parameters(), *eq4.parameters()],
                                     regularizer=eq4.loss)
        ctx.artefacts.record("eq4", eq4.summary())
        return result

    def state_dict(self) -> dict[str, Any]:
        """Everything setup built (the indices) and the rounds learnt, eq. 4's P and classifier
        included, so that a resumed node needs no setup exchange."""
        eq4 = self._eq4.state_dict() if self._eq4 is not None else self._eq4_state
        return {
            "history": dict(self.history), "last_cohort": list(self.last_cohort), "last_drawn": dict(self.last_drawn),
            "indices": {n: {"feature": i.feature.tolist(), "label": i.label.tolist()} for n, i in self.indices.items()},
            "n_train": dict(self.n_train),
            "eq4": None if eq4 is None else {k: tensor_to_text(v) for k, v in eq4.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.history = {str(k): float(v) for k, v in state["history"].items()}
        self.last_cohort = [str(x) for x in state["last_cohort"]]
        self.last_drawn = {str(k): int(v) for k, v in state["last_drawn"].items()}
        indices = {str(n): ClientIndex(torch.tensor(i["feature"], dtype=torch.float32), torch.tensor(i["label"], dtype=torch.float32))
                   for n, i in state.get("indices", {}).items()}
        if any(i.feature.ndim != 1 or i.feature.shape != i.label.shape for i in indices.values()):
            raise ValueError("client2vec state: every index needs a feature and a label vector of one length")
        self.indices = indices
        self.n_train = {str(k): int(v) for k, v in state.get("n_train", {}).items()}
        self._eq4_state = None if state.get("eq4") is None else {k: tensor_from_text(v) for k, v in state["eq4"].items()}
        self._eq4 = None  # rebuilt on the next fit, around the node's model, from _eq4_state


