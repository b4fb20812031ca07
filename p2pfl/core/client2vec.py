"""Client2Vec's math (Guo et al., seed 004): DSA-IGN, its losses, client indices, eq. 1, 3 and 4.

Pure tensors and modules: no networking, no files. The strategy that runs it over the wire
lives in `p2pfl.algorithms.client2vec`; encoders in `p2pfl.models.encoders`.

Shapes: a batch of B image embeddings D (B, d) and label embeddings L (B, d), both
L2-normalised; d = `embed_dim` (512 in the paper). DSA-IGN returns the data encoding z and
the sample feature index u^f, both (B, d), and the reconstruction D~ (B, d).

Readings of the paper, settled here (README's Client2Vec section repeats them):

* Input tokens. The paper reshapes [D; D] (B, 2d) into 2d / d_model tokens of width d_model
  and feeds them to a transformer encoder *without positional encoding*. Such an encoder is
  permutation-equivariant, and the two halves of [D; D] are the same token multiset, so the
  first half of the output (z) equals the second (u^f) exactly. `positional=True` (default)
  adds a learned positional embedding so z and u^f can differ; `False` keeps the paper's
  network (tests show Z == U without it).
* L_orth. As printed, ||Z U^T||_1 summed over the raw B x B products dominates L_sim by
  orders of magnitude and z learns no labels. `orth="cosine"` (default) is the mean of
  |cos(z_j, u_k)| over all pairs, on the scale of the other losses; `"raw"` keeps the sum.
* L_div uses temperature 1: (1/B) sum_j log sum_{k != j} exp(cos(u_j, u_k)).
* sim(a, b) is the cosine; when either vector is all zeros it is 0 (no direction, no
  similarity), not NaN.
* Eq. 1, decentralised: a node samples the peers it downloads from. Its previous cohort
  C^{t-1} is itself plus the peers it downloaded in round t-1 (the models that formed its
  last aggregate); K = ceil(fraction * M) peers without replacement, M the number of
  peers; round 1 uniform; a peer downloaded within the last floor(M / (2K)) rounds has
  probability 0 (the window rounds down; at least one round when M >= 2K is false: 0).
* Eq. 3 with history: H_i^t = gamma * H_i^{t-1} + S(beta_i, C^t), for every peer i, so the
  sum over tau of gamma^(t - tau) S(beta_i, C^tau) is kept in one number per peer.
* Eq. 4: z_P = z P with a trainable P (feature_dim x d); L_orth = mean |z_P B^f| with every
  beta^f scaled to unit norm; L_dist = KL(softmax(logits of z) || softmax(logits of z_P)),
  the second classifier reading z_P; P and that classifier stay on the node. mu weighs
  L_orth + L_dist (paper: 1.0 federated, 5.0 global).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

ORTH_MODES = ("cosine", "raw", "cosine2")
LOSS_TERMS = ("div", "sim", "orth", "recon")


@dataclass(frozen=True)
class DSAIGNConfig:
    """DSA-IGN's shape (paper Appendix D.2) and the readings above, as parameters."""

    embed_dim: int = 512
    d_model: int = 32
    heads: int = 8
    layers: int = 3
    # The paper's 2048 (PyTorch's default) makes a CPU step ~6x slower (benchmarks/dsa_ign_step.py)
    # index quality is measured at 256 (docs/client2vec.md); 2048 remains a parameter.
    ff_dim: int = 256
    dropout: float = 0.1
    positional: bool = True
    orth: str = "cosine"
    losses: tuple[str, ...] = LOSS_TERMS  # the Table-2 ablation drops some

    def __post_init__(self) -> None:
        if self.embed_dim < 1 or self.d_model < 1 or self.heads < 1 or self.layers < 1 or self.ff_dim < 1:
            raise ValueError("embed_dim, d_model, heads, layers and ff_dim must be >= 1")
        if (2 * self.embed_dim) % self.d_model:
            raise ValueError(f"2 * embed_dim ({2 * self.embed_dim}) must be a multiple of d_model ({self.d_model})")
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of heads ({self.heads})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.orth not in ORTH_MODES:
            raise ValueError(f"orth must be one of {ORTH_MODES}, got {self.orth!r}")
        unknown = [t for t in self.losses if t not in LOSS_TERMS]
        if unknown or not self.losses:
            raise ValueError(f"losses must be a non-empty subset of {LOSS_TERMS}, got {list(self.losses)}")

    @property
    def tokens(self) -> int:
        return 2 * self.embed_dim // self.d_model


class DSAIGN(nn.Module):
    """Decomposition block (transformer encoder over [D; D] as tokens) plus a linear projection back to D."""

    def __init__(self, config: DSAIGNConfig = DSAIGNConfig()) -> None:
        super().__init__()
        self.config = c = config
        layer = nn.TransformerEncoderLayer(c.d_model, c.heads, c.ff_dim, c.dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, c.layers, enable_nested_tensor=False)
        self.position = nn.Parameter(torch.randn(1, c.tokens, c.d_model) * 0.02) if c.positional else None
        self.project = nn.Linear(2 * c.embed_dim, c.embed_dim)

    def decompose(self, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """z and u^f of a batch of image embeddings (B, embed_dim)."""
        c = self.config
        tokens = torch.cat([d, d], dim=1).reshape(d.shape[0], c.tokens, c.d_model)
        if self.position is not None:
            tokens = tokens + self.position
        out = self.encoder(tokens).reshape(d.shape[0], 2 * c.embed_dim)
        return out[:, : c.embed_dim], out[:, c.embed_dim:]

    def forward(self, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        z, u = self.decompose(d)
        return z, u, self.project(torch.cat([z, u], dim=1))


# ---- losses ---------------------------------------------------------------------------------


def loss_sim(z: torch.Tensor, label_embedding: torch.Tensor) -> torch.Tensor:
    """L_sim = mean over the batch of 1 - cos(z, L)."""
    return (1.0 - F.cosine_similarity(z, label_embedding, dim=1)).mean()


def loss_orth(z: torch.Tensor, u: torch.Tensor, mode: str = "cosine") -> torch.Tensor:
    """L_orth: "raw" = ||Z U^T||_1 (sum of |z_j . u_k|); "cosine" = mean |cos(z_j, u_k)|;
    "cosine2" = mean cos²(z_j, u_k) (ours: smooth at 0, where |cos| has a kink)."""
    if mode == "raw":
        return (z @ u.T).abs().sum()
    if mode == "cosine":
        return (F.normalize(z, dim=1) @ F.normalize(u, dim=1).T).abs().mean()
    if mode == "cosine2":
        return (F.normalize(z, dim=1) @ F.normalize(u, dim=1).T).square().mean()
    raise ValueError(f"orth must be one of {ORTH_MODES}, got {mode!r}")


def loss_recon(reconstruction: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(reconstruction, d)


def loss_div(u: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """L_div = (1/B) sum_j log sum_{k != j} exp(cos(u_j, u_k) / T); needs B >= 2."""
    if u.shape[0] < 2:
        raise ValueError("L_div needs a batch of at least 2 samples")
    unit = F.normalize(u, dim=1)
    sims = unit @ unit.T / temperature
    eye = torch.eye(u.shape[0], dtype=torch.bool, device=u.device)
    return torch.logsumexp(sims.masked_fill(eye, float("-inf")), dim=1).mean()


def dsa_ign_losses(model: DSAIGN, d: torch.Tensor, label_embedding: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each configured term of DSA-IGN's objective on one batch (their sum is the loss)."""
    z, u, rec = model(d)
    terms = {
        "div": lambda: loss_div(u),
        "sim": lambda: loss_sim(z, label_embedding),
        "orth": lambda: loss_orth(z, u, model.config.orth),
        "recon": lambda: loss_recon(rec, d),
    }
    return {name: terms[name]() for name in model.config.losses}


@dataclass(frozen=True)
class IndexTraining:
    """How DSA-IGN is trained (unstated in the paper; these are the settled defaults)."""

    epochs: int = 100
    batch_size: int = 128
    lr: float = 1e-3

    def __post_init__(self) -> None:
        if self.epochs < 0 or self.batch_size < 2 or not self.lr > 0:
            raise ValueError(f"epochs >= 0, batch_size >= 2 and lr > 0 are required, got {self}")


@dataclass
class TrainLog:
    steps: int = 0
    last: dict[str, float] = field(default_factory=dict)


def train_dsa_ign(
    model: DSAIGN,
    d: torch.Tensor,
    label_embedding: torch.Tensor,
    training: IndexTraining = IndexTraining(),
    *,
    generator: torch.Generator | None = None,
    optimizer: torch.optim.Optimizer | None = None,
) -> TrainLog:
    """Adam over shuffled batches of (D, L) pairs for `training.epochs` epochs, in place.

    A last batch of one sample is dropped (L_div needs two). Returns the last batch's terms.
    """
    if d.shape != label_embedding.shape:
        raise ValueError(f"D {tuple(d.shape)} and L {tuple(label_embedding.shape)} must have the same shape")
    if d.shape[0] < 2:
        raise ValueError("DSA-IGN needs at least 2 samples")
    optimizer = optimizer or torch.optim.Adam(model.parameters(), lr=training.lr)
    log = TrainLog()
    model.train()
    n = d.shape[0]
    for _ in range(training.epochs):
        order = torch.randperm(n, generator=generator)
        for start in range(0, n, training.batch_size):
            idx = order[start: start + training.batch_size]
            if idx.numel() < 2:
                continue
            terms = dsa_ign_losses(model, d[idx], label_embedding[idx])
            loss = torch.stack(list(terms.values())).sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            log.steps += 1
            log.last = {k: float(v.detach()) for k, v in terms.items()}
    model.eval()
    return log


def federated_dsa_ign(
    model: DSAIGN,
    datasets: Sequence[tuple[torch.Tensor, torch.Tensor]],
    *,
    rounds: int,
    fraction: float,
    training: IndexTraining,
    rng: np.random.Generator,
    generator: torch.Generator | None = None,
) -> list[list[int]]:
    """The FEDERATED strategy in one process (the reference the peer-to-peer form is tested
    against): each round ceil(fraction * N) datasets, drawn uniformly without replacement,
    train a copy of `model` for `training.epochs` epochs from its current state (a fresh Adam
    each time, as FedAvg's clients do), and `model` becomes their sample-weighted average.
    Returns who trained in each round."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    k = max(1, math.ceil(fraction * len(datasets)))
    chosen_per_round = []
    for _ in range(rounds):
        chosen = sorted(rng.choice(len(datasets), size=k, replace=False).tolist())
        states, sizes = [], []
        for i in chosen:
            local = copy.deepcopy(model)
            d, lab = datasets[i]
            train_dsa_ign(local, d, lab, training, generator=generator)
            states.append(local.state_dict())
            sizes.append(d.shape[0])
        total = float(sum(sizes))
        model.load_state_dict({key: sum(s[key] * (n / total) for s, n in zip(states, sizes)) for key in states[0]})
        chosen_per_round.append(chosen)
    model.eval()
    return chosen_per_round


@torch.no_grad()
def sample_feature_indices(model: DSAIGN, d: torch.Tensor, batch_size: int = 1024) -> torch.Tensor:
    """u^f of every sample (eval mode: no dropout)."""
    was_training = model.training
    model.eval()
    out = torch.cat([model.decompose(d[i: i + batch_size])[1] for i in range(0, d.shape[0], batch_size)])
    model.train(was_training)
    return out


@dataclass(frozen=True)
class ClientIndex:
    """beta = [beta^f ; beta^l]: the means of u^f and of u^l = L over a node's samples."""

    feature: torch.Tensor  # beta^f, (d,)
    label: torch.Tensor  # beta^l, (d,)

    @property
    def full(self) -> torch.Tensor:
        return torch.cat([self.feature, self.label])


FEATURE_MEANS = ("samples", "balanced")


def client_index(model: DSAIGN, d: torch.Tensor, label_embedding: torch.Tensor, feature_mean: str = "samples") -> ClientIndex:
    """beta^f as the paper's mean of u^f over the samples (`"samples"`), or `"balanced"`: the mean
    over the node's classes of each class's mean u^f, so that the node's label proportions,
    which beta^l already carries, do not move beta^f (u^f still carries some label information)."""
    u = sample_feature_indices(model, d)
    if feature_mean == "samples":
        feature = u.mean(0)
    elif feature_mean == "balanced":
        _, label_of = torch.unique(label_embedding, dim=0, return_inverse=True)
        feature = torch.stack([u[label_of == c].mean(0) for c in label_of.unique()]).mean(0)
    else:
        raise ValueError(f"feature_mean must be one of {FEATURE_MEANS}, got {feature_mean!r}")
    return ClientIndex(feature, label_embedding.mean(0))


def mean_embedding_index(d: torch.Tensor, label_embedding: torch.Tensor) -> ClientIndex:
    """The baseline index the issue asks to report: the mean of D in place of beta^f."""
    return ClientIndex(d.mean(0), label_embedding.mean(0))


# ---- similarity, eq. 1 and eq. 3 ------------------------------------------------------------------


def cosine(a: torch.Tensor | np.ndarray, b: torch.Tensor | np.ndarray) -> float:
    """Cosine similarity, 0 when either vector is all zeros."""
    a = torch.as_tensor(a, dtype=torch.float64).flatten()
    b = torch.as_tensor(b, dtype=torch.float64).flatten()
    na, nb = float(a.norm()), float(b.norm())
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(a @ b) / (na * nb)


def similarity_matrix(vectors: Sequence[torch.Tensor]) -> np.ndarray:
    """Pairwise cosines (the paper's Fig. 2 heatmaps)."""
    n = len(vectors)
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(n):
            out[i, j] = cosine(vectors[i], vectors[j])
    return out


@dataclass(frozen=True)
class GroupSeparation:
    """How well indices separate known groups (domains): the paper's Fig. 2 read as numbers."""

    same: float  # mean cosine over pairs of distinct nodes in one group
    cross: float  # mean cosine over pairs in different groups
    nearest_in_group: int  # nodes whose most similar other node shares their group
    nodes: int

    @property
    def gap(self) -> float:
        return self.same - self.cross


def group_separation(vectors: Sequence[torch.Tensor | np.ndarray], groups: Sequence[str]) -> GroupSeparation:
    """Same-group minus cross-group mean cosine, and nearest neighbours, of one index per node."""
    if len(vectors) != len(groups) or len(vectors) < 2:
        raise ValueError("one group per vector and at least two vectors are needed")
    s = similarity_matrix(vectors)
    n = len(vectors)
    same = [s[i, j] for i in range(n) for j in range(n) if i != j and groups[i] == groups[j]]
    cross = [s[i, j] for i in range(n) for j in range(n) if groups[i] != groups[j]]
    if not same or not cross:
        raise ValueError("needs at least one group with two nodes and at least two groups")
    nearest = [max((j for j in range(n) if j != i), key=lambda j: s[i, j]) for i in range(n)]
    hits = sum(groups[i] == groups[nearest[i]] for i in range(n))
    return GroupSeparation(float(np.mean(same)), float(np.mean(cross)), hits, n)


def cohort_similarity(
    indices: Mapping[str, ClientIndex], n_samples: Mapping[str, int], cohort: Sequence[str], candidate: str
) -> float:
    """S(beta_i, C) = 1 / (2 N^C) sum_{j in C} N_j (sim(beta^f_i, beta^f_j) + sim(beta^l_i, beta^l_j))."""
    if not cohort:
        raise ValueError("the cohort is empty")
    total = sum(n_samples[j] for j in cohort)
    if total <= 0:
        raise ValueError("the cohort holds no samples")
    i = indices[candidate]
    acc = sum(n_samples[j] * (cosine(i.feature, indices[j].feature) + cosine(i.label, indices[j].label)) for j in cohort)
    return acc / (2.0 * total)


def exclusion_window(peers: int, per_round: int) -> int:
    """floor(M / (2K)) rounds: how long a peer just downloaded stays out of the draw."""
    if per_round < 1:
        raise ValueError("per_round must be >= 1")
    return peers // (2 * per_round)


def sampling_probabilities(similarities: Mapping[str, float], tau: float, excluded: set[str] = frozenset()) -> dict[str, float]:
    """Eq. 1: softmax of S / tau over the candidates, 0 for those in the exclusion window.

    When every candidate is excluded the window is ignored (a round must still draw someone).
    """
    if not tau > 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    open_ = [k for k in similarities if k not in excluded] or list(similarities)
    if not open_:
        return {}
    logits = np.array([similarities[k] / tau for k in open_])
    w = np.exp(logits - logits.max())
    w = w / w.sum()
    probs = {k: 0.0 for k in similarities}
    probs.update(zip(open_, w.tolist()))
    return probs


def draw_without_replacement(probabilities: Mapping[str, float], k: int, rng: np.random.Generator) -> list[str]:
    """k names drawn by probability, without replacement (fewer when fewer have mass)."""
    names = [n for n, p in probabilities.items() if p > 0]
    if not names:
        return []
    p = np.array([probabilities[n] for n in names])
    picks = rng.choice(len(names), size=min(k, len(names)), replace=False, p=p / p.sum())
    return [names[i] for i in sorted(picks.tolist())]


def aggregation_weights(
    history: Mapping[str, float], prior: Mapping[str, float], heat: float
) -> dict[str, float]:
    """Eq. 3: p_i ∝ q_i exp(H_i / lambda_1) over the cohort (the keys of `prior`)."""
    if not heat > 0:
        raise ValueError(f"lambda_1 (heat) must be > 0, got {heat}")
    names = list(prior)
    q = np.array([prior[n] for n in names], dtype=np.float64)
    if (q < 0).any() or q.sum() <= 0:
        raise ValueError(f"the prior must be non-negative with positive mass, got {dict(prior)}")
    logits = np.array([history.get(n, 0.0) for n in names]) / heat
    w = q * np.exp(logits - logits.max())
    w = w / w.sum()
    return dict(zip(names, w.tolist()))


def aggregation_objective(p: np.ndarray, history: np.ndarray, prior: np.ndarray, heat: float) -> float:
    """Eq. 2 on the simplex (A3 vanishes): sum p_i H_i + lambda_1 sum p_i log(q_i / p_i)."""
    p = np.asarray(p, dtype=np.float64)
    mask = p > 0
    entropy = float(np.sum(p[mask] * np.log(prior[mask] / p[mask])))
    return float(p @ history) + heat * entropy


# ---- eq. 4 ------------------------------------------------------------------------------------


def orthogonality_to_indices(z_projected: torch.Tensor, feature_indices: torch.Tensor, mode: str = "cosine") -> torch.Tensor:
    """Eq. 4's L_orth(z_P, B^f), every column beta^f of B^f (d, N) scaled to unit norm.

    "raw": mean |z_P B^f|, the printed ||z_P B^f||_1 as a mean. It is also minimised by z = 0,
    and its gradient does shrink z: at weight 5 it silences the ReLU features of LeNet on
    digits in the first epoch (loss stays at ln 10). "cosine" (default): mean |cos(z_P, beta^f)|,
    which no rescaling of z changes, so only turning z_P away from B^f lowers it - the same
    reading as DSA-IGN's `orth`. "cosine2" (this project's): mean cos²(z_P, beta^f), scale-free
    like "cosine" but smooth where z_P is orthogonal to B^f: its gradient fades near the optimum
    instead of pushing with constant force from either side, a milder regulariser at equal μ."""
    unit = F.normalize(feature_indices, dim=0)
    if mode == "raw":
        return (z_projected @ unit).abs().mean()
    if mode == "cosine":
        return (F.normalize(z_projected, dim=1) @ unit).abs().mean()
    if mode == "cosine2":
        return (F.normalize(z_projected, dim=1) @ unit).square().mean()
    raise ValueError(f"orth must be one of {ORTH_MODES}, got {mode!r}")


def distillation(logits: torch.Tensor, projected_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(logits of z) || softmax(logits of z_P)), batch mean."""
    return F.kl_div(F.log_softmax(projected_logits, dim=1), F.log_softmax(logits, dim=1),
                    log_target=True, reduction="batchmean")
