"""Leave-one-out influence of FedC2I (Tan, Long, Jiang, Zhang: "Influence-Oriented
Personalized Federated Learning"), in the decentralized form of ALGORITHMS.md.

Node m holds M models (its own included), each split into a body θ_i and a linear head
φ_i (rows φ_{i,c}, biases b_{i,c}). On one batch B of its own training data:

* client level (eq. 4-6): θ₋ᵢ = mean_{j≠i} θ_j, l₋ᵢ = L(θ₋ᵢ, φ_m; B),
  λᵢ = l₋ᵢ^γ / Σⱼ l₋ⱼ^γ, new body Σᵢ λᵢ θᵢ;
* class level (eq. 7-10): φ₋ᵢ,c = mean_{j≠i} φ_{j,c} (row and bias), l₋ᵢ,₋c = loss of
  node m's model with head row c replaced by φ₋ᵢ,c, Λ^{i,c} = l₋ᵢ,₋c^γ / Σⱼ l₋ⱼ,₋c^γ, new
  row c = Σᵢ Λ^{i,c} φ_{i,c} (eq. 10 prints φ_{m,c}: a typo, it is φ_{i,c}).

How the cost is kept down, since this runs on every node every round:

* the M client-level losses are one batched forward pass: the M leave-one-out bodies are
  stacked and `torch.vmap` maps `torch.func.functional_call` over them, so no state dict is
  ever copied into a module;
* the M·C class-level losses need no forward pass at all beyond one: the features
  h = body_m(B) are computed once with node m's own body, and replacing head row c changes
  only logit column c, so all M·C losses come from one tensor expression over the
  (M, C, |B|) replaced logits, with a log-sum-exp over the untouched columns per (sample,
  class) computed once.

Pure math on tensors: no networking, no files, no node state. Weights come back as float64
tensors whose first dimension is the model index i (the order the caller passed).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

State = Mapping[str, torch.Tensor]

HEAD_WEIGHT = "head.weight"
HEAD_BIAS = "head.bias"

# Losses are floored here before the power γ. An exact zero loss (a float32 cross-entropy
# underflows once the margin passes ~100) would otherwise make l^γ / Σ l^γ = 0/0 when every
# leave-one-out model is perfect on the batch. With the floor, all-zero losses give uniform
# weights (the limit of equal losses) and a zero next to positive losses gets weight ~0 (the
# limit of l -> 0), so the formula's own limits are kept and no special case is needed.
LOSS_FLOOR = torch.finfo(torch.float64).tiny


class InfluenceError(ValueError):
    """The influence cannot be computed: a leave-one-out loss is NaN, infinite or negative.

    Such a loss means a broken model (a diverged own model, or overflowing parameters), and
    no weighting of the models can be derived from it; callers decide what to keep.
    """


@dataclass(frozen=True)
class LeaveOneOutInfluence:
    """Normalised influence weights and the leave-one-out losses they came from.

    `weights` sums to 1 over dim 0 (over models). `losses` is None when only one model is
    held (M = 1): there is no leave-one-out model, and the single model gets weight 1.
    """

    weights: torch.Tensor
    losses: torch.Tensor | None


# ---- weights from losses (eq. 5 and 9) -------------------------------------------------------
def influence_weights(losses: torch.Tensor | Sequence[float], gamma: float) -> torch.Tensor:
    """l^γ / Σ l^γ along dim 0, in float64.

    Computed as softmax(γ · log l) over dim 0, which is the same quotient but cannot
    overflow or underflow to 0/0 for large γ (γ = 10 with losses of 2-3 already spans four
    orders of magnitude). γ = 0 gives uniform weights, as the paper says, by definition
    rather than through 0^0. See `LOSS_FLOOR` for zero losses.
    """
    if not (gamma >= 0 and gamma != float("inf")):
        raise ValueError(f"gamma must be a finite number >= 0, got {gamma}")
    loss = torch.as_tensor(losses, dtype=torch.float64)
    if loss.ndim == 0 or loss.shape[0] == 0:
        raise ValueError("influence_weights needs at least one loss along dim 0")
    if not torch.isfinite(loss).all():
        raise InfluenceError(f"non-finite leave-one-out loss: {loss.flatten().tolist()[:16]}")
    if (loss < 0).any():
        raise InfluenceError(f"negative leave-one-out loss: {loss.flatten().tolist()[:16]}")
    if gamma == 0:
        return torch.full_like(loss, 1.0 / loss.shape[0])
    return torch.softmax(gamma * loss.clamp_min(LOSS_FLOOR).log(), dim=0)


# ---- leave-one-out means (eq. 4 and 7) -------------------------------------------------------
def leave_one_out_means(stacked: torch.Tensor) -> torch.Tensor:
    """(M, ...) -> (M, ...): entry i is the mean over j ≠ i of the M entries.

    (Σⱼ xⱼ − xᵢ) / (M − 1), accumulated in float64 so that the subtraction does not cost
    the float32 digits that separate nearby models, then cast back.
    """
    m = stacked.shape[0]
    if m < 2:
        raise ValueError(f"leave-one-out needs at least 2 entries, got {m}")
    wide = stacked.to(torch.float64)
    return ((wide.sum(0, keepdim=True) - wide) / (m - 1)).to(stacked.dtype)


def stack_states(states: Sequence[State], device: torch.device | None = None) -> dict[str, torch.Tensor]:
    """One (M, ...) tensor per key; every state must have the same keys and shapes."""
    if not states:
        raise ValueError("no states to stack")
    keys = list(states[0])
    for i, s in enumerate(states[1:], start=1):
        if set(s) != set(keys):
            raise ValueError(f"state {i} has keys {sorted(s)}, expected {sorted(keys)}")
    stacked = {k: torch.stack([s[k].detach() for s in states]) for k in keys}
    return stacked if device is None else {k: v.to(device) for k, v in stacked.items()}


@contextlib.contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """Evaluate with dropout off and BatchNorm on its running statistics, then restore.

    Influence is a measurement: it must not update BatchNorm statistics, and train-mode
    BatchNorm (an in-place buffer update) is also what `vmap` cannot batch.
    """
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)


def _device(module: nn.Module) -> torch.device:
    first = next(module.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


# ---- client level (eq. 4-6) ------------------------------------------------------------------
@torch.no_grad()
def leave_one_out_losses(
    model: nn.Module,
    states: Sequence[State],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    fixed: State | None = None,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Cross-entropy of `model` on (x, y) with each leave-one-out mean of `states` (float64, (M,)).

    `states` are M partial state dicts with the same keys (node m's bodies: `body.*`);
    `fixed` holds the tensors kept the same for every i (node m's head φ_m); anything in
    neither comes from `model` itself. Integer tensors (BatchNorm's `num_batches_tracked`)
    are not averaged: the module's own value is used.
    """
    if len(states) < 2:
        raise ValueError(f"leave-one-out losses need at least 2 models, got {len(states)}")
    device = _device(model)
    x, y = x.to(device), y.to(device)
    stacked = stack_states(states, device)
    loo = {k: leave_one_out_means(v) for k, v in stacked.items() if v.is_floating_point()}
    const = {k: v.to(device) for k, v in (fixed or {}).items()}

    def loss_of(params: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = functional_call(model, {**const, **params}, (x,))
        return F.cross_entropy(logits, y)

    with eval_mode(model):
        try:
            losses = torch.vmap(loss_of, chunk_size=chunk_size)(loo)
        except (RuntimeError, NotImplementedError) as exc:
            # vmap has no batching rule for some modules (data-dependent control flow such
            # as `.item()` in forward, in-place updates of unbatched buffers, custom
            # autograd functions without a vmap rule). One functional_call per model gives
            # the same numbers M times slower; an error that is not vmap's own repeats here.
            warnings.warn(f"vmap cannot batch this model ({exc}); computing the {len(states)} "
                          "leave-one-out losses one at a time", RuntimeWarning, stacklevel=2)
            losses = torch.stack([loss_of({k: v[i] for k, v in loo.items()}) for i in range(len(states))])
    return losses.to(torch.float64)


def client_influence(
    model: nn.Module,
    bodies: Sequence[State],
    head: State,
    x: torch.Tensor,
    y: torch.Tensor,
    gamma: float,
    *,
    chunk_size: int | None = None,
) -> LeaveOneOutInfluence:
    """λ (eq. 5): one weight per body, from the loss on (x, y) when that body is left out.

    `head` is node m's own head φ_m, used for every leave-one-out model. With one body
    (M = 1) there is nothing to leave out: λ = [1].
    """
    if len(bodies) == 1:
        return LeaveOneOutInfluence(torch.ones(1, dtype=torch.float64), None)
    losses = leave_one_out_losses(model, bodies, x, y, fixed=head, chunk_size=chunk_size)
    return LeaveOneOutInfluence(influence_weights(losses, gamma), losses)


# ---- class level (eq. 7-10) ------------------------------------------------------------------
@torch.no_grad()
def eval_features(body: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """h = body(x) in eval mode, without a graph: the features every class-level loss shares."""
    with eval_mode(body):
        return body(x.to(_device(body)))


def class_leave_one_out_losses(
    features: torch.Tensor,
    weights: torch.Tensor,
    biases: torch.Tensor,
    y: torch.Tensor,
    own: int = 0,
) -> torch.Tensor:
    """l₋ᵢ,₋c for every model i and class c, as a float64 (M, C) tensor, from one expression.

    `features` (B, D) are node m's own body's features of the batch, `weights` (M, C, D)
    and `biases` (M, C) the M heads, `own` the index of node m's head among them. The
    model for (i, c) is node m's head with row c (and bias c) replaced by the mean of the
    other M − 1 heads' row c, so its logits equal node m's logits Z (B, C) except in column
    c, which becomes h · φ₋ᵢ,c + b₋ᵢ,c. Hence, per sample b:

        logsumexp = logaddexp(logsumexp_{k≠c} Z_bk, new_ibc)        (first term computed once)
        target    = new_ibc if y_b = c else Z_b,y_b

    Memory is O(M·C·B + B·C²), never M·C copies of anything. Computed in float64: the head
    math is cheap next to the one forward pass, and differences between nearby heads are
    what the weights are made of.
    """
    m, c, d = weights.shape
    if m < 2:
        raise ValueError(f"leave-one-out losses need at least 2 heads, got {m}")
    if biases.shape != (m, c) or features.ndim != 2 or features.shape[1] != d:
        raise ValueError(f"shapes disagree: features {tuple(features.shape)}, weights {tuple(weights.shape)}, "
                         f"biases {tuple(biases.shape)}")
    h = features.to(torch.float64)
    w = weights.to(h.device, torch.float64)
    b = biases.to(h.device, torch.float64)
    y = y.to(h.device)
    classes = torch.arange(c, device=h.device)
    own_logits = torch.addmm(b[own], h, w[own].T)                                   # (B, C)
    new_col = torch.einsum("bd,mcd->mcb", h, leave_one_out_means(w)) + leave_one_out_means(b)[..., None]  # (M, C, B)
    others = own_logits[:, None, :].masked_fill(torch.eye(c, dtype=torch.bool, device=h.device), float("-inf"))
    lse = torch.logaddexp(others.logsumexp(-1).T[None], new_col)                   # (M, C, B)
    target = torch.where(y[None, None, :] == classes[None, :, None], new_col,
                         own_logits.gather(1, y[:, None]).squeeze(1)[None, None, :])
    return (lse - target).mean(-1)


def class_influence(
    features: torch.Tensor,
    heads: Sequence[State],
    y: torch.Tensor,
    gamma: float,
    *,
    own: int = 0,
    weight_key: str = HEAD_WEIGHT,
    bias_key: str = HEAD_BIAS,
) -> LeaveOneOutInfluence:
    """Λ (eq. 9): an (M, C) matrix, each column c normalised over the M models.

    `features` = `eval_features(own body, x)`; `heads[own]` is node m's head. With one head
    (M = 1) Λ is all ones.
    """
    weights = torch.stack([hd[weight_key].detach() for hd in heads])
    if len(heads) == 1:
        return LeaveOneOutInfluence(torch.ones(1, weights.shape[1], dtype=torch.float64), None)
    biases = torch.stack([hd[bias_key].detach() for hd in heads])
    losses = class_leave_one_out_losses(features, weights, biases, y, own)
    return LeaveOneOutInfluence(influence_weights(losses, gamma), losses)


# ---- aggregation (eq. 6 and 10) --------------------------------------------------------------
def combine_states(states: Sequence[State], weights: torch.Tensor | Sequence[float], own: int = 0) -> dict[str, torch.Tensor]:
    """Σᵢ wᵢ stateᵢ per key (eq. 6), accumulated in float64, in the dtype and device of `states[own]`.

    The weights are used as given (λ already sums to 1). Integer tensors are not averaged:
    `states[own]`'s value is kept.
    """
    w = torch.as_tensor(weights, dtype=torch.float64).flatten()
    if w.shape[0] != len(states):
        raise ValueError(f"{w.shape[0]} weights for {len(states)} states")
    out: dict[str, torch.Tensor] = {}
    for k, ref in states[own].items():
        if not ref.is_floating_point():
            out[k] = ref.detach().clone()
            continue
        stacked = torch.stack([s[k].detach().to(ref.device, torch.float64) for s in states])
        out[k] = torch.tensordot(w.to(ref.device), stacked, dims=1).to(ref.dtype)
    return out


def weighted_average(states: Sequence[State], weights: Sequence[float]) -> dict[str, torch.Tensor]:
    """Σ w_i state_i over the keys of the first state, with `weights` normalised to sum to 1."""
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("weights must have a positive sum")
    return combine_states(states, [w / total for w in weights])


class RunningWeightedMean:
    """Σᵢ wᵢ stateᵢ / Σᵢ wᵢ folded in one state at a time, so a caller never holds them all.

    Sums in float64 like `combine_states`, so the order in which states are added moves the
    result by far less than the float32 rounding of the answer. `dtype=None` sums in each
    tensor's own dtype instead (NumPy's sum in Flower's `aggregate`): half the memory for a
    float32 model, and a result that can differ by its rounding with the order of the adds.
    Integer tensors are not averaged: the first state's value is kept.
    """

    def __init__(self, dtype: torch.dtype | None = torch.float64) -> None:
        self.dtype = dtype
        self._sum: dict[str, torch.Tensor] = {}
        self._first: dict[str, torch.Tensor] = {}
        self.total = 0.0
        self.count = 0

    def add(self, state: State, weight: float) -> None:
        if not weight > 0:
            raise ValueError(f"weight must be > 0, got {weight}")
        if self.count and set(state) != set(self._first):
            raise ValueError(f"state keys differ from the first state's: {sorted(set(state) ^ set(self._first))[:3]}")
        for k, v in state.items():
            if not self.count:
                self._first[k] = v.detach()
            if not v.is_floating_point():
                continue
            v = v.detach().to(self._first[k].device)
            if k in self._sum:
                # In place, widened inside the kernel: no float64 copy of the state per add
                # (a node folds every peer's model on its event loop).
                self._sum[k].add_(v, alpha=weight)
            else:
                self._sum[k] = v.to(self.dtype or v.dtype, copy=True).mul_(weight)  # one new tensor, not two
        self.total += weight
        self.count += 1

    def mean(self, *, last: bool = False) -> dict[str, torch.Tensor]:
        """The weighted mean, in the dtype and device of the first state. `last`: the caller
        takes no other mean of these states, so the sums are divided in place (no copy of the
        model in the sums' dtype) and nothing may be added or taken after."""
        if not self.count:
            raise ValueError("no state was added")
        mean = {k: (self._sum[k].div_(self.total) if last else self._sum[k] / self.total).to(ref.dtype)
                if ref.is_floating_point() else ref.clone() for k, ref in self._first.items()}
        if last:
            self._sum, self._first, self.count = {}, {}, 0
        return mean


def combine_heads(
    heads: Sequence[State],
    class_weights: torch.Tensor,
    *,
    own: int = 0,
    weight_key: str = HEAD_WEIGHT,
    bias_key: str = HEAD_BIAS,
) -> dict[str, torch.Tensor]:
    """Row c of the new head = Σᵢ Λ^{i,c} φ_{i,c}, and bias c = Σᵢ Λ^{i,c} b_{i,c} (eq. 10, typo fixed)."""
    lam = torch.as_tensor(class_weights, dtype=torch.float64)
    ref_w, ref_b = heads[own][weight_key], heads[own][bias_key]
    if lam.shape != (len(heads), ref_w.shape[0]):
        raise ValueError(f"class weights of shape {tuple(lam.shape)} for {len(heads)} heads of {ref_w.shape[0]} classes")
    lam = lam.to(ref_w.device)
    w = torch.stack([hd[weight_key].detach().to(ref_w.device, torch.float64) for hd in heads])  # (M, C, D)
    b = torch.stack([hd[bias_key].detach().to(ref_w.device, torch.float64) for hd in heads])    # (M, C)
    return {
        weight_key: torch.einsum("mc,mcd->cd", lam, w).to(ref_w.dtype),
        bias_key: (lam * b).sum(0).to(ref_b.dtype),
    }
