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

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from p2pfl.algorithms import register
from p2pfl.core.client2vec import (
    DSAIGN,
    FEATURE_MEANS,
    LOSS_TERMS,
    ORTH_MODES,
    ClientIndex,
    DSAIGNConfig,
    IndexTraining,
    aggregation_weights,
    client_index,
    cohort_similarity,
    distillation,
    draw_without_replacement,
    exclusion_window,
    mean_embedding_index,
    orthogonality_to_indices,
    sampling_probabilities,
    train_dsa_ign,
)
from p2pfl.core.influence import weighted_average
from p2pfl.models import SplitModel, load_part, part_spec, part_state
from p2pfl.models.encoders import build_image_encoder, build_label_encoder, encode_images
from p2pfl.runtime.metadata import MAX_SAMPLES, MetaField
from p2pfl.runtime.strategy import (
    COORDINATOR_ID,
    CoordinatorEnv,
    CoordinatorHalf,
    Fetch,
    PartDecl,
    PeerModel,
    Push,
    Reply,
    RoundContext,
    Strategy,
    Submission,
    setup_part,
)
from p2pfl.training import FitResult

STRATEGIES = ("global", "federated")
INDICES = ("client2vec", "mean_embedding")
PROJECTIONS = ("trainable", "fixed")
BATCH = 128  # the paper's upload: one batch of (D, L) pairs per node
N_TRAIN_META = {"n_train": MetaField("int", 1, MAX_SAMPLES, required=True)}
OPTIONAL_N_TRAIN = {"n_train": MetaField("int", 1, MAX_SAMPLES)}  # peers' DSA-IGN steps carry it, the coordinator's not


def dsa_ign_config(embed_dim: int, d_model: int, heads: int, layers: int, ff_dim: int, dropout: float,
                   positional: bool, orth: str, losses: list[str] | tuple[str, ...]) -> DSAIGNConfig:
    return DSAIGNConfig(embed_dim=int(embed_dim), d_model=int(d_model), heads=int(heads), layers=int(layers),
                        ff_dim=int(ff_dim), dropout=float(dropout), positional=bool(positional), orth=str(orth),
                        losses=tuple(losses))


class Client2VecHalf(CoordinatorHalf):
    """The GLOBAL strategy's coordinator: trains DSA-IGN on every node's batch, once, before round 1."""

    setup_kind = "batch"

    def __init__(self, env: CoordinatorEnv, embed_dim: int = 512, d_model: int = 32, heads: int = 8, layers: int = 3,
                 ff_dim: int = 256, dropout: float = 0.1, positional: bool = True, orth: str = "cosine",
                 losses: tuple[str, ...] = LOSS_TERMS, index_epochs: int = 60, index_lr: float = 1e-3) -> None:
        super().__init__(env)
        self.config = dsa_ign_config(embed_dim, d_model, heads, layers, ff_dim, dropout, positional, orth, losses)
        self.training = IndexTraining(epochs=int(index_epochs), batch_size=BATCH, lr=float(index_lr))

    def expected(self, kind: str) -> PartDecl | None:
        if kind != "batch":
            return None
        shape = ((BATCH, self.config.embed_dim), "float32")
        return PartDecl({"d": shape, "l": shape}, N_TRAIN_META)

    def setup(self, submissions: list[Submission]) -> Reply:
        t0 = time.perf_counter()
        finite = [s for s in submissions if all(bool(torch.isfinite(s.state[k]).all()) for k in ("d", "l"))]
        if not finite:
            raise ValueError("every node's batch holds non-finite embeddings")
        d = torch.cat([s.state["d"].float().cpu() for s in finite])
        lab = torch.cat([s.state["l"].float().cpu() for s in finite])
        torch.manual_seed(self.env.seed)
        model = DSAIGN(self.config)
        log = train_dsa_ign(model, d, lab, self.training, generator=torch.Generator().manual_seed(self.env.seed))
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return Reply(parts={setup_part("dsa_ign"): state},
                     info={"samples": int(d.shape[0]), "steps": log.steps, "last_losses": log.last,
                           "dropped_non_finite": sorted({s.node_id for s in submissions} - {s.node_id for s in finite}),
                           "seconds": time.perf_counter() - t0})


@register
class Client2Vec(Strategy):
    """Decentralised FedAvg over K peers a round, with Client2Vec's sampling, aggregation and local training."""

    name = "client2vec"
    coordinator = Client2VecHalf
    shared_parts = ("full",)

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
        indices_from: str | None = None,
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
        # "{seed}" in the path picks each seed's run (read in setup); a fixed path is read now, to fail early.
        self.indices_from = indices_from if self.uses_index else None
        self.reused = read_indices(indices_from) if self.indices_from and "{seed}" not in self.indices_from else None

    @property
    def uses_index(self) -> bool:
        """With every use switched off (the FedAvg row) no index is built, so none is sent or paid for."""
        return self.sampling or self.aggregation or self.local

    @property
    def needs_coordinator(self) -> bool:
        return self.uses_index and self.indices_from is None and self.index_kind == "client2vec" and self.strategy == "global"

    def privacy_conflict(self, mode: str) -> str | None:
        if mode != "dp-sgd" or not self.uses_index:
            return None
        if self.needs_coordinator:  # the federated strategy shares DSA-IGN weights only, like FedAvg
            return ("the global strategy sends 128 image embeddings with their exact labels to the coordinator, "
                    "outside DP-SGD's accounting; use index = \"mean_embedding\" or no DP-SGD")
        if self.index_kind == "client2vec":
            return ("the federated strategy shares DSA-IGN weights trained on the node's data before round 1, "
                    "outside DP-SGD's accounting; use index = \"mean_embedding\" or no DP-SGD")
        if self.local and self.mu > 0:
            return "eq. 4 trains a projection and a second classifier outside the private model; set local = false"
        return None

    def extra_parts(self, model: SplitModel) -> dict[str, PartDecl]:
        dim = self.config.embed_dim
        return {
            setup_part("dsa_ign"): PartDecl(part_spec(DSAIGN(self.config), "full"), OPTIONAL_N_TRAIN),
            setup_part("index"): PartDecl({"feature": ((dim,), "float32"), "label": ((dim,), "float32")}, N_TRAIN_META),
        }

    # ---- before round 1 ------------------------------------------------------------------------
    def embeddings(self, ctx: RoundContext) -> tuple[torch.Tensor, torch.Tensor]:
        image, label, prompt = self.encoders
        dim = self.config.embed_dim
        encoder = build_image_encoder(image, dim, ctx.seed)
        labels = build_label_encoder(label, ctx.model.num_classes, dim, ctx.seed, prompt=prompt)
        train = ctx.data.train
        return encode_images(encoder, train.x.cpu()), labels(train.y.cpu())

    def setup(self, ctx: RoundContext) -> None:
        if not self.uses_index:
            return
        if self.indices_from is not None:
            self.adopt(ctx, self.reused or read_indices(self.indices_from.format(seed=ctx.seed)))
            return
        if ctx.exchange is None:
            raise RuntimeError("client2vec needs the runtime's setup exchange (ctx.exchange)")
        t0 = time.perf_counter()
        d, lab = self.embeddings(ctx)
        index_step = 2
        if self.index_kind == "mean_embedding":
            own = mean_embedding_index(d, lab)
        elif self.strategy == "federated":
            model = self.federated(ctx, d, lab)
            own = client_index(model, d, lab, self.feature_mean)
            index_step = self.index_rounds + 1
        else:
            rows = torch.as_tensor(ctx.rng.choice(len(d), size=BATCH, replace=len(d) < BATCH))
            ctx.log(f"{ctx.node_id}: sending {BATCH} image embeddings with their labels to the coordinator "
                    "(Client2Vec's global strategy; they are derived from the node's data)")
            ctx.exchange.push(1, [Push(COORDINATOR_ID, kind="batch", part="batch",
                                       tensors={"d": d[rows].contiguous(), "l": lab[rows].contiguous()},
                                       meta={"n_train": len(ctx.data.train)})])
            replies = ctx.exchange.fetch(1, [Fetch(COORDINATOR_ID, "dsa_ign")])
            if not replies:
                raise RuntimeError("no DSA-IGN from the coordinator within runtime.setup_wait_s")
            model = DSAIGN(self.config)
            model.load_state_dict(replies[0].tensors)
            own = client_index(model.cpu(), d, lab, self.feature_mean)
        self.indices = {ctx.node_id: own}
        self.n_train = {ctx.node_id: len(ctx.data.train)}
        ctx.exchange.publish(index_step, {"index": {"feature": own.feature.float(), "label": own.label.float()}}, {})
        for m in ctx.exchange.fetch(index_step, [Fetch(peer, "index") for peer in ctx.peers]):
            self.indices[m.sender] = ClientIndex(m.tensors["feature"].float().cpu(), m.tensors["label"].float().cpu())
            self.n_train[m.sender] = m.n_train
        missing = sorted(set(ctx.peers) - set(self.indices))
        if missing:
            ctx.log(f"{ctx.node_id}: no index from {missing}; they count as dissimilar (S = 0)")
        ctx.artefacts.record("client2vec", {
            "strategy": self.strategy if self.index_kind == "client2vec" else "mean_embedding",
            "index": own.full.tolist(), "feature_index": own.feature.tolist(),
            "seconds": time.perf_counter() - t0, "peers_without_index": missing,
        })

    def adopt(self, ctx: RoundContext, reused: "ReusedIndices") -> None:
        """Take every node's index from an earlier run (`indices_from`) instead of building them.

        The index is fixed before round 1 and does not depend on the three switches, so the
        ablation's rows can share the one their seed built; refused unless the run had the same
        seed, the same nodes and this node's training-set size."""
        nodes = {ctx.node_id, *ctx.peers}
        problems = []
        if reused.seed != ctx.seed:
            problems.append(f"seed {reused.seed} (this run: {ctx.seed})")
        if set(reused.indices) != nodes:
            problems.append(f"nodes {sorted(set(reused.indices) ^ nodes)} in one run only")
        elif reused.n_train.get(ctx.node_id) != len(ctx.data.train):
            problems.append(f"{ctx.node_id} trained on {reused.n_train.get(ctx.node_id)} samples (here {len(ctx.data.train)})")
        if problems:
            raise ValueError(f"algorithm.params.indices_from: {reused.path} was built on other data: {'; '.join(problems)}")
        self.indices, self.n_train = dict(reused.indices), dict(reused.n_train)
        own = self.indices[ctx.node_id]
        ctx.artefacts.record("client2vec", {
            "strategy": reused.strategy, "index": own.full.tolist(), "feature_index": own.feature.tolist(),
            "seconds": 0.0, "peers_without_index": [], "indices_from": reused.path,
        })

    def federated(self, ctx: RoundContext, d: torch.Tensor, lab: torch.Tensor) -> DSAIGN:
        """The FEDERATED strategy, peer to peer: FedAvg of DSA-IGN over `index_rounds` steps.

        Who trains in step s is a draw every node makes alike from the scenario's seed (no
        server to sample): ceil(index_fraction * N) of the N nodes. A node drawn in step s
        starts from the average of step s-1's models (fetched from the nodes drawn then; all
        start from the same seeded initialisation), trains `index_local_epochs` on its own
        (D, L) with a fresh Adam, and publishes the result as step s. After the last step every
        node averages the last step's models, so all end with the same DSA-IGN."""
        assert ctx.exchange is not None
        ids = sorted([ctx.node_id, *ctx.peers])
        k = max(1, math.ceil(self.index_fraction * len(ids)))
        draws = np.random.default_rng([ctx.seed, 0xC2F]).random((self.index_rounds, len(ids))).argsort(axis=1)[:, :k]
        chosen = [sorted(ids[i] for i in row) for row in draws]
        torch.manual_seed(ctx.seed)
        model = DSAIGN(self.config)
        generator = torch.Generator().manual_seed(int(ctx.rng.integers(2**31)))
        own_models: dict[int, dict[str, torch.Tensor]] = {}

        def average(step: int) -> None:
            """`model` becomes the sample-weighted mean of the models trained in `step`."""
            states, sizes = [], []
            if step in own_models:
                states.append(own_models[step])
                sizes.append(float(len(d)))
            others = [p for p in chosen[step - 1] if p != ctx.node_id]
            for m in ctx.exchange.fetch(step, [Fetch(p, "dsa_ign") for p in others]):  # type: ignore[union-attr]
                states.append(m.tensors)
                sizes.append(float(m.n_train))
            if states:  # nothing arrived: keep the model we have
                model.load_state_dict(weighted_average(states, sizes))

        trained = 0
        for step in range(1, self.index_rounds + 1):
            if ctx.node_id not in chosen[step - 1]:
                continue
            if step > 1:
                average(step - 1)
            local = DSAIGN(self.config)
            local.load_state_dict(model.state_dict())
            train_dsa_ign(local, d, lab, self.local_training, generator=generator)
            own_models[step] = {k: v.detach().clone() for k, v in local.state_dict().items()}
            ctx.exchange.publish(step, {"dsa_ign": own_models[step]}, {})
            trained += 1
        average(self.index_rounds)
        digest = float(sum(v.double().sum() for v in model.state_dict().values()))
        ctx.artefacts.record("dsa_ign", {"steps_trained": trained, "steps": self.index_rounds, "per_step": k,
                                         "state_sum": digest})
        return model.eval()

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


def tensor_to_text(t: torch.Tensor) -> dict[str, Any]:
    """A float tensor for a JSON checkpoint, exactly: shape and float32 bytes as hex."""
    return {"shape": list(t.shape), "float32": t.detach().cpu().float().contiguous().numpy().tobytes().hex()}


def tensor_from_text(doc: dict[str, Any]) -> torch.Tensor:
    shape = [int(s) for s in doc["shape"]]
    data = bytearray(bytes.fromhex(doc["float32"]))
    if len(data) != 4 * math.prod(shape):
        raise ValueError(f"a tensor of shape {shape} needs {4 * math.prod(shape)} bytes, got {len(data)}")
    return torch.frombuffer(data, dtype=torch.float32).reshape(shape).clone()


@dataclass(frozen=True)
class ReusedIndices:
    path: str
    seed: int
    strategy: str
    indices: dict[str, ClientIndex]
    n_train: dict[str, int]


def read_indices(path: str) -> ReusedIndices:
    """The indices an earlier run recorded in its results.json (its "client2vec" block)."""
    field = "indices_from"
    try:
        results = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{field}: cannot read {path}: {exc}") from exc
    block = results.get("client2vec") if isinstance(results, dict) else None
    if not isinstance(block, dict):
        raise ValueError(f"{field}: {path} holds no Client2Vec indices (not a client2vec run's results.json)")
    try:
        indices = {}
        for node, full in block["indices"].items():
            feature = torch.tensor(block["feature_indices"][node], dtype=torch.float32)
            indices[node] = ClientIndex(feature, torch.tensor(full, dtype=torch.float32)[len(feature):])
        n_train = {n["id"]: int(n["n_train"]) for n in results["nodes"] if n["id"] in indices}
        seed = int(results["scenario"]["seed"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{field}: {path} has a malformed client2vec block: {exc!r}") from exc
    return ReusedIndices(str(path), seed, str(block.get("strategy")), indices, n_train)


class Eq4(nn.Module):
    """Eq. 4's extra terms on the body's features z of the batch being trained (read by a forward hook)."""

    def __init__(self, model: SplitModel, feature_indices: torch.Tensor, mu: float, *, trainable: bool, seed: int,
                 orth: str = "cosine") -> None:
        super().__init__()
        device = next(model.parameters()).device
        g = torch.Generator().manual_seed(seed + 7)
        dim = feature_indices.shape[0]
        self.projection = nn.Parameter(torch.randn(model.feature_dim, dim, generator=g) / math.sqrt(model.feature_dim),
                                       requires_grad=trainable)
        self.classifier = nn.Linear(dim, model.num_classes)
        # Rebuilt from the indices, so not part of the checkpointed state.
        self.register_buffer("feature_indices", feature_indices.float(), persistent=False)
        self.mu, self.orth = mu, orth
        self.to(device)
        self._z: torch.Tensor | None = None
        self._last: dict[str, float] = {}

    def capturing(self, model: SplitModel) -> "_Hook":
        return _Hook(self, model)

    def loss(self, model: nn.Module) -> torch.Tensor:
        z = self._z
        if z is None:
            raise RuntimeError("eq. 4: no features captured for this batch")
        self._z = None
        z = z.flatten(1)
        z_p = z @ self.projection
        orth = orthogonality_to_indices(z_p, self.feature_indices, self.orth)
        logits = model.head(z)  # type: ignore[operator]
        dist = distillation(logits, self.classifier(z_p))
        self._last = {"orth": float(orth.detach()), "distill": float(dist.detach())}
        return self.mu * (orth + dist)

    def summary(self) -> dict[str, float]:
        with torch.no_grad():
            norm = float((self.projection @ torch.nn.functional.normalize(self.feature_indices, dim=0)).norm())
        return {**self._last, "projection_times_indices_norm": norm, "mu": self.mu}


class _Hook:
    def __init__(self, eq4: Eq4, model: SplitModel) -> None:
        self.eq4, self.model = eq4, model
        self.handle: Any = None

    def __enter__(self) -> "_Hook":
        def keep(_module: nn.Module, _inputs: Any, output: torch.Tensor) -> None:
            self.eq4._z = output

        self.handle = self.model.body.register_forward_hook(keep)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.handle.remove()
        self.eq4._z = None

