"""Client2Vec before round 1: every node's index, built (the coordinator's DSA-IGN, the federated
strategy, or the mean-embedding baseline) or taken from an earlier run, then exchanged."""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from p2pfl.algorithms.client2vec.reuse import ReusedIndices
from p2pfl.core.client2vec import (
    DSAIGN,
    LOSS_TERMS,
    ClientIndex,
    DSAIGNConfig,
    IndexTraining,
    client_index,
    mean_embedding_index,
    train_dsa_ign,
)
from p2pfl.core.influence import weighted_average
from p2pfl.models.encoders import build_image_encoder, build_label_encoder, encode_images
from p2pfl.models import SplitModel, part_spec
from p2pfl.runtime.metadata import MAX_SAMPLES, MetaField
from p2pfl.runtime.coordinator_half import CoordinatorEnv, CoordinatorHalf, Reply, Submission
from p2pfl.runtime.strategy import COORDINATOR_ID, Fetch, PartDecl, Push, RoundContext, setup_part

BATCH = 128  # the paper's upload: one batch of (D, L) pairs per node
N_TRAIN_META = {"n_train": MetaField("int", 1, MAX_SAMPLES, required=True)}
OPTIONAL_N_TRAIN = {"n_train": MetaField("int", 1, MAX_SAMPLES)}  # peers' DSA-IGN steps carry it, the coordinator's not


def dsa_ign_config(embed_dim: int, d_model: int, heads: int, layers: int, ff_dim: int, dropout: float,
                   positional: bool, orth: str, losses: list[str] | tuple[str, ...]) -> DSAIGNConfig:
    return DSAIGNConfig(embed_dim=int(embed_dim), d_model=int(d_model), heads=int(heads), layers=int(layers),
                        ff_dim=int(ff_dim), dropout=float(dropout), positional=bool(positional), orth=str(orth),
                        losses=tuple(losses))


def upload_rows(n: int, rng: np.random.Generator) -> np.ndarray:
    """Which of a node's `n` training pairs fill its BATCH rows: BATCH distinct ones where it has
    them; otherwise every pair once, the remaining rows repeats (the upload has a fixed shape)."""
    if n >= BATCH:
        return rng.choice(n, size=BATCH, replace=False)
    return np.concatenate([rng.permutation(n), rng.choice(n, size=BATCH - n, replace=True)])


def distinct_pairs(d: torch.Tensor, label_embedding: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of one upload without repeats, in the order of their first appearance.

    A node with fewer than BATCH pairs repeats them to fill its upload. Trained on as sent, a node
    of 3 pairs would weigh each 43 times as much as a full node does its own, repeats would be
    their own negatives in L_div, and 1000 such nodes would make the coordinator train on 128,000
    rows where there are 3,000."""
    _, which = torch.unique(torch.cat([d, label_embedding], dim=1), dim=0, return_inverse=True)
    first = torch.full((int(which.max()) + 1,), len(which)).scatter_reduce(0, which, torch.arange(len(which)), "amin")
    keep = first.sort().values
    return d[keep], label_embedding[keep]


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
        distinct = [distinct_pairs(s.state["d"].float().cpu(), s.state["l"].float().cpu()) for s in finite]
        # On the scenario's device: 500 epochs of the paper's index take ~25 min on one CPU thread.
        d = torch.cat([pair[0] for pair in distinct]).to(self.env.device)
        lab = torch.cat([pair[1] for pair in distinct]).to(self.env.device)
        torch.manual_seed(self.env.seed)
        model = DSAIGN(self.config).to(self.env.device)
        log = train_dsa_ign(model, d, lab, self.training, generator=torch.Generator().manual_seed(self.env.seed))
        state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        return Reply(parts={setup_part("dsa_ign"): state},
                     info={"samples": int(d.shape[0]), "uploaded": BATCH * len(finite), "steps": log.steps,
                           "last_losses": log.last,
                           "dropped_non_finite": sorted({s.node_id for s in submissions} - {s.node_id for s in finite}),
                           "seconds": time.perf_counter() - t0})



class IndexBuilding:
    """`Client2Vec.setup`: the node's index and its peers', before round 1 (state set by `Client2Vec.__init__`)."""

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
            if self.reused is None:
                raise RuntimeError(f"indices_from = {self.indices_from!r} was not read: the scenario layer reads it "
                                   "(p2pfl.scenario.run_inputs.resolve_run_inputs) before the strategy is built")
            self.adopt(ctx, self.reused)
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
            own = client_index(self.global_dsa_ign(ctx, d, lab), d, lab, self.feature_mean)
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

    def global_dsa_ign(self, ctx: RoundContext, d: torch.Tensor, lab: torch.Tensor) -> DSAIGN:
        """The GLOBAL strategy's DSA-IGN: the coordinator's, trained on every node's batch. A node
        that joins after round 1 finds that setup over; it takes the DSA-IGN from the first
        neighbour that serves it (each node serves what it got when the run brings joiners) and
        builds its own index with it, before its first round. Its batch trains nothing."""
        exchange = ctx.exchange
        assert exchange is not None
        if exchange.late:
            served = exchange.first(1, "dsa_ign", list(ctx.peers))
            if served is None:
                raise RuntimeError(f"no neighbour of {sorted(ctx.peers)} served Client2Vec's DSA-IGN within "
                                   "runtime.fetch_timeout_s: nodes serve it to joiners only when the scenario's [churn] "
                                   "schedules joins")
            state = served.tensors
            ctx.log(f"{ctx.node_id}: joined after round 1; index built with {served.sender}'s copy of the DSA-IGN")
        else:
            rows = torch.as_tensor(upload_rows(len(d), ctx.rng))
            ctx.log(f"{ctx.node_id}: sending {BATCH} image embeddings with their labels to the coordinator "
                    "(Client2Vec's global strategy; they are derived from the node's data)")
            exchange.push(1, [Push(COORDINATOR_ID, kind="batch", part="batch",
                                   tensors={"d": d[rows].contiguous(), "l": lab[rows].contiguous()},
                                   meta={"n_train": len(ctx.data.train)})])
            replies = exchange.fetch(1, [Fetch(COORDINATOR_ID, "dsa_ign")])
            if not replies:
                raise RuntimeError("no DSA-IGN from the coordinator within runtime.setup_wait_s")
            state = replies[0].tensors
        model = DSAIGN(self.config)
        model.load_state_dict({k: v.cpu() for k, v in state.items()})
        if exchange.joiners:
            exchange.publish(1, {"dsa_ign": model.state_dict()}, {})
        return model.cpu()

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

