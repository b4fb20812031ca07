"""FedAMP's attentive message passing (Huang et al., AAAI 2021), the weights alone.

A client i's personalised cloud model is u_i = ξ_ii w_i + Σ_{j≠i} ξ_ij w_j with
ξ_ij = α_k A'(‖w_i − w_j‖²) for j ≠ i and ξ_ii = 1 − Σ_{j≠i} ξ_ij, where A(x) = 1 − e^{−x/σ}
is the paper's attention function, so A'(x) = e^{−x/σ} / σ: models close to w_i weigh more.
The paper assumes α_k small enough that ξ_ii ≥ 0; where the peers' coefficients sum past 1 they
are scaled to sum to 1 and ξ_ii is 0 (ours: a weight below 0 would extrapolate away from w_i).
Distances are over every floating tensor of the state, in float64.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch


def squared_distance(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    return float(sum(((a[k].double() - b[k].double()) ** 2).sum() for k in a if a[k].is_floating_point()))


def attention_weights(own: Mapping[str, torch.Tensor], peers: Sequence[Mapping[str, torch.Tensor]],
                      alpha_k: float, sigma: float) -> tuple[float, list[float]]:
    """(ξ_ii, [ξ_ij for each peer j]) for the node holding `own`."""
    if not (alpha_k > 0 and sigma > 0 and math.isfinite(alpha_k) and math.isfinite(sigma)):
        raise ValueError(f"alpha_k and sigma must be finite and > 0, got {alpha_k}, {sigma}")
    coefficients = [alpha_k * math.exp(-squared_distance(own, peer) / sigma) / sigma for peer in peers]
    total = sum(coefficients)
    if total > 1.0:
        coefficients = [c / total for c in coefficients]
        total = 1.0
    return 1.0 - total, coefficients
