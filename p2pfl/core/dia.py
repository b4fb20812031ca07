"""Aggregation weights from per-domain statistics: DI's DIA (eq. 12–15) and FedDG-GA.

DIA (Zhou et al., "data influences adjuster"), for n submitting domains with local
weights ξ_k (from `p2pfl.core.influence_functions.data_influence`) and training-loss sums
φ_k:

    ξ'_k = mapping(ξ)_k                              (the paper: ξ_k / Σ ξ, see below)
    w1_k = 1/n + (ξ'_k − 1/n) / (2α)                 (eq. 13)
    φ'_k = φ_k / Σ φ
    w2_k = 1/n + (exp(−φ'_k) − 1/n) / (2β)           (eq. 14)
    ω_k  = (w1_k⁺ + w2_k⁺) / Σ_i (w1_i⁺ + w2_i⁺)      (eq. 12, 15; ⁺ = clipped at 0)

* α, β ∈ (0, ∞]; ∞ makes that term the equal weight 1/n. α = 1/2 makes w1 = ξ' exactly.
  The paper's text says "α = 0" allocates entirely by ξ'; its eq. 13 gives that at α = 1/2
  (α → 0 blows the deviation from 1/n up), so we follow the formula (ALGORITHMS.md). Note
  that even then ω = (ξ' + w2)/Σ, not ξ': eq. 12 always adds the φ term, which at β = ∞ is
  1/n, so ω = (ξ' + 1/n)/2. Only the DIA-off ablation (`p2pfl.algorithms.global_model`)
  aggregates by ξ' alone.
* Small α (or β) drives w1 (w2) negative for below-average domains; both terms are clipped
  at 0 before normalising, so ω is a proper distribution for any inputs.
* φ is a *sum* of losses (the paper's definition), so a domain with more data has a larger
  φ' and a smaller w2 at equal mean loss. exp(−φ'_k) ∈ [e⁻¹, 1] is not normalised, as printed.

ξ' (eq. 12). The paper's ξ'_k = ξ_k / Σ ξ is mapping "ratio", the default. When every ξ has
one sign it is |ξ_k| / Σ|ξ|, a share by magnitude. Every DI run here records all ξ negative,
and there the ratio gives the most negative ξ the largest share: by Koh & Liang's sign, the
domain whose up-weighting lowers the core loss most. Mixed signs make ξ/Σξ meaningless (the
sum can be ~0, and negative entries become negative "shares"). Our fallback there follows the
sign convention the observed regime fixes: a domain is helpful by −ξ, so

    ξ'_k = max(−ξ_k, 0) / Σ_j max(−ξ_j, 0)        (mixed signs only)

Harmful domains (ξ > 0) get share 0; the helpful ones share by magnitude, exactly as the
ratio shares them when all ξ < 0. The fallback is continuous where an entry crosses 0 from the
all-negative regime (its share is ≈0 on both sides); it is not continuous with the all-positive
regime, where the printed ratio favours the largest ξ (the most harmful by Koh & Liang) and
is used as printed. All ξ = 0 gives equal shares.

Three order-preserving maps (larger ξ → larger or equal ξ') remain as options; they read ξ
the other way round (larger ξ = more weight) and so reverse the paper's order when all ξ < 0:

* "shift": ξ'_k = (ξ_k − m)/Σ_i(ξ_i − m) with m = min(0, min_i ξ_i); equal to the ratio when
  all ξ ≥ 0. The smallest ξ gets share 0 when any ξ < 0.
* "rank": ξ' ∝ rank of ξ (1 = smallest; ties share the mean rank): ignores magnitudes.
* "softmax": ξ' = softmax(z/τ) with z = (ξ − mean ξ)/std ξ; standardising makes it invariant
  to the scale of ξ, which changes by orders of magnitude with the model and the damping.

All four are invariant to multiplying ξ by a positive constant. Equal ξ (including all
zero) give equal shares.

GA (FedDG-GA, Zhang et al., CVPR 2023), weights a_k initialised to 1/n and updated each
round from the generalization gap G_k of domain k, how much worse the global model does on
k's validation data than k's own local model (loss: G = L(θ_g) − L(θ̂_k); accuracy:
G = acc(θ̂_k) − acc(θ_g)):

    a_k ← a_k + d_r · (G_k − mean G) / max_j |G_j − mean G|,   then clip to [0, 1], renormalise,
    d_r = (d / n) · (1 − (r − 1)/R)   (linear decay over R rounds; d = 0.2 by default).

Domains the global model serves worst gain weight. The official code moves by
G_k / max|G| (uncentred) with step d/3 for its three source domains; we centre as in the
paper (the update then moves weight between domains and keeps Σ a = 1 before clipping) and
generalise 1/3 to 1/n. `center=False` gives the official code's update.

Pure math over numpy arrays; imports nothing from p2pfl.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

XI_MAPPINGS = ("ratio", "shift", "rank", "softmax")
DEFAULT_XI_MAPPING = "ratio"
GA_METRICS = ("loss", "acc")
GA_DEFAULT_STEP = 0.2


def _as_finite(values: Sequence[float] | np.ndarray, what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    if arr.size == 0:
        raise ValueError(f"{what} is empty")
    if not np.isfinite(arr).all():
        raise ValueError(f"{what} must be finite, got {arr.tolist()}")
    return arr


def _uniform(n: int) -> np.ndarray:
    return np.full(n, 1.0 / n)


def _check_strength(value: float, name: str) -> float:
    value = float(value)
    if not value > 0:  # rejects NaN as well
        raise ValueError(f"{name} must be > 0 (math.inf for equal weights), got {value}")
    return value


def validate_dia_params(alpha: float, beta: float, mapping: str, temperature: float = 1.0) -> None:
    """Raise ValueError on DIA parameters `dia` would reject (checked before any node starts)."""
    _check_strength(alpha, "alpha")
    _check_strength(beta, "beta")
    if mapping not in XI_MAPPINGS:
        raise ValueError(f"unknown ξ mapping {mapping!r}; choose one of {XI_MAPPINGS}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def influence_distribution(xi: Sequence[float] | np.ndarray, mapping: str = DEFAULT_XI_MAPPING,
                           temperature: float = 1.0) -> np.ndarray:
    """ξ' on the simplex: "ratio" is eq. 12's ξ/Σξ (with the mixed-sign fallback), the others
    are order-preserving (module doc)."""
    if mapping not in XI_MAPPINGS:
        raise ValueError(f"unknown ξ mapping {mapping!r}; choose one of {XI_MAPPINGS}")
    arr = _as_finite(xi, "xi")
    n = arr.size
    scale = float(np.abs(arr).max())
    if scale == 0.0:
        return _uniform(n)
    arr = arr / scale  # every mapping is scale-invariant; this keeps ξ − min from overflowing
    if mapping == "ratio":
        if (arr <= 0).all() or (arr >= 0).all():
            return arr / arr.sum()  # one sign: ξ/Σξ as printed, = |ξ|/Σ|ξ|
        helpful = np.clip(-arr, 0.0, None)  # mixed signs: Koh & Liang's helpful direction only
        return helpful / helpful.sum()
    if mapping == "shift":
        shifted = arr - min(0.0, float(arr.min()))
        total = float(shifted.sum())
        return _uniform(n) if total <= 0.0 else shifted / total
    if mapping == "rank":
        order = arr.argsort(kind="stable")
        ranks = np.empty(n)
        ranks[order] = np.arange(1, n + 1, dtype=np.float64)
        for value in np.unique(arr):  # ties share their mean rank, so equal ξ get equal shares
            tied = arr == value
            ranks[tied] = ranks[tied].mean()
        return ranks / ranks.sum()
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    std = float(arr.std())
    if std == 0.0:
        return _uniform(n)
    z = (arr - arr.mean()) / (std * temperature)
    e = np.exp(z - z.max())
    return e / e.sum()


def influence_shares(xi: Sequence[float | None], mapping: str = DEFAULT_XI_MAPPING,
                     temperature: float = 1.0) -> np.ndarray:
    """ξ' with missing entries (None: a node that sent no finite ξ): the others are mapped among
    themselves and a missing one gets share 0, the smallest any mapping gives, so a node that
    sends nothing never outweighs one that did. All missing: equal shares. NaN is an error."""
    present = [i for i, v in enumerate(xi) if v is not None]
    shares = np.zeros(len(xi))
    if not present:
        return _uniform(len(xi))
    shares[present] = influence_distribution([float(xi[i]) for i in present], mapping, temperature)  # type: ignore[arg-type]
    return shares


def loss_distribution(phi: Sequence[float] | np.ndarray) -> np.ndarray:
    """φ' = φ / Σ φ for non-negative loss sums (equal shares when all are 0)."""
    arr = _as_finite(phi, "phi")
    if (arr < 0).any():
        raise ValueError(f"phi are sums of losses and must be >= 0, got {arr.tolist()}")
    top = float(arr.max())
    if top == 0.0:
        return _uniform(arr.size)
    arr = arr / top  # avoid overflow of Σφ for huge losses
    return arr / arr.sum()


def trade_off(share: np.ndarray, strength: float) -> np.ndarray:
    """1/n + (share − 1/n)/(2·strength): eq. 13 (share ξ') and eq. 14 (share e^{−φ'}); ∞ → 1/n."""
    n = share.size
    if math.isinf(strength):
        return _uniform(n)
    return 1.0 / n + (share - 1.0 / n) / (2.0 * strength)


@dataclass(frozen=True)
class DIA:
    """Every term of eq. 12–15, kept for records; `omega` are the aggregation weights."""

    xi_prime: np.ndarray
    phi_prime: np.ndarray
    w1: np.ndarray  # unclipped
    w2: np.ndarray  # unclipped
    omega: np.ndarray


def dia(
    xi: Sequence[float] | np.ndarray | None,
    phi: Sequence[float] | np.ndarray,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    mapping: str = DEFAULT_XI_MAPPING,
    temperature: float = 1.0,
) -> DIA:
    """DIA weights (eq. 12–15). `xi=None` (DIC off) makes ξ' uniform, hence w1 = 1/n; an entry of
    `xi` that is None gets ξ' = 0 (`influence_shares`), the smallest w1."""
    alpha = _check_strength(alpha, "alpha")
    beta = _check_strength(beta, "beta")
    phi_prime = loss_distribution(phi)
    n = phi_prime.size
    if xi is None:
        xi_prime = _uniform(n)
    else:
        xi_prime = influence_shares(list(xi), mapping, temperature)
        if xi_prime.size != n:
            raise ValueError(f"xi has {xi_prime.size} entries but phi has {n}")
    w1 = trade_off(xi_prime, alpha)
    w2 = trade_off(np.exp(-phi_prime), beta)
    # Σ w1 = 1 before clipping and clipping only raises entries, so the total is >= 1 > 0.
    total = np.clip(w1, 0.0, None) + np.clip(w2, 0.0, None)
    return DIA(xi_prime, phi_prime, w1, w2, total / total.sum())


def dia_weights(
    xi: Sequence[float] | np.ndarray | None,
    phi: Sequence[float] | np.ndarray,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    mapping: str = DEFAULT_XI_MAPPING,
    temperature: float = 1.0,
) -> np.ndarray:
    """ω of eq. 15 (see `dia`)."""
    return dia(xi, phi, alpha=alpha, beta=beta, mapping=mapping, temperature=temperature).omega


# ---- FedDG-GA ------------------------------------------------------------------------------------
def validate_ga_params(step_size: float, metric: str) -> None:
    if not step_size >= 0:
        raise ValueError(f"step_size must be >= 0, got {step_size}")
    if metric not in GA_METRICS:
        raise ValueError(f"unknown GA metric {metric!r}; choose one of {GA_METRICS}")


def generalization_gap(global_metric: float, local_metric: float, metric: str = "loss") -> float:
    """How much worse the global model is than the local one on a domain's validation data."""
    if metric not in GA_METRICS:
        raise ValueError(f"unknown GA metric {metric!r}; choose one of {GA_METRICS}")
    return global_metric - local_metric if metric == "loss" else local_metric - global_metric


def ga_step_size(round_: int, rounds: int, n: int, step_size: float = GA_DEFAULT_STEP) -> float:
    """d_r = (d/n)(1 − (r − 1)/R): linear decay from d/n at round 1 towards 0 after round R."""
    if rounds < 1 or n < 1:
        raise ValueError("rounds and n must be >= 1")
    if step_size < 0:
        raise ValueError(f"step_size must be >= 0, got {step_size}")
    return (step_size / n) * max(0.0, 1.0 - (round_ - 1) / rounds)


def ga_update(
    weights: Sequence[float] | np.ndarray,
    gaps: Sequence[float] | np.ndarray,
    step: float,
    *,
    center: bool = True,
) -> np.ndarray:
    """One GA move: a + step · normalised gap, clipped to [0, 1], renormalised to sum 1."""
    a = _as_finite(weights, "weights")
    g = _as_finite(gaps, "gaps")
    if a.size != g.size:
        raise ValueError(f"{a.size} weights but {g.size} gaps")
    if center:
        g = g - g.mean()
    top = float(np.abs(g).max())
    if top > 0.0:
        a = a + step * g / top
    a = np.clip(a, 0.0, 1.0)
    total = float(a.sum())
    return _uniform(a.size) if total == 0.0 else a / total
