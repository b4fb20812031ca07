"""Decentralized FedProx (Li et al., MLSys 2020): FedAvg with a proximal term in local training.

The local objective is L(w) + μ/2 ‖w − w_start‖², with w_start the model the round started
from (`ctx.round_start`: the previous round's aggregate, FedProx's global model w^t). The
term pulls local training towards the aggregate so that heterogeneous nodes drift less.
Sharing, downloads and aggregation are FedAvg's (this class inherits them). μ = 0.01 is
the value of the FedC2I paper's baseline. Under DP-SGD the trainer hands the term to the
privacy mechanism, which adds its gradient after clipping and noise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from p2pfl.algorithms import register
from p2pfl.algorithms.fedavg import FedAvg
from p2pfl.runtime.strategy import RoundContext
from p2pfl.training.trainer import FitResult


def proximal_term(mu: float, anchor: Mapping[str, torch.Tensor]) -> Callable[[nn.Module], torch.Tensor]:
    """A regularizer r(model) = μ/2 Σ ‖p − anchor[name]‖² over the model's named parameters.

    Its gradient is μ (p − anchor). The anchor tensors are detached copies, so the term never
    back-propagates into them; parameters missing from `anchor` are not regularized.
    """
    fixed = {k: v.detach().clone() for k, v in anchor.items()}

    def regularizer(model: nn.Module) -> torch.Tensor:
        total: torch.Tensor | None = None
        for name, p in model.named_parameters():
            if name in fixed and p.requires_grad:
                a = fixed[name]
                if a.device != p.device:
                    a = fixed[name] = a.to(p.device)
                term = (p - a).pow(2).sum()
                total = term if total is None else total + term
        if total is None:
            return torch.zeros(())
        return 0.5 * mu * total

    return regularizer


@register
class FedProx(FedAvg):
    name = "fedprox"

    def __init__(self, mu: float = 0.01, aggregation: str = "mean", trim: float = 0.1, staleness: float = 0.0,
                 byzantine: int = 1, keep: int = 0, fallback: bool = False, sum_dtype: str = "float64") -> None:
        if not (mu >= 0 and mu != float("inf")):
            raise ValueError(f"mu must be a finite number >= 0, got {mu}")
        super().__init__(aggregation, trim, staleness, byzantine, keep, fallback, sum_dtype)
        self.mu = mu

    def fit(self, ctx: RoundContext) -> FitResult:
        if self.mu == 0:
            return super().fit(ctx)  # exactly FedAvg's local training, without a zero term
        # The runtime sets round_start before fit; a hand-built context may not, and then the
        # model as it is now is the round's start.
        anchor = ctx.round_start or {k: v.detach().clone() for k, v in ctx.model.state_dict().items()}
        return ctx.trainer.fit(ctx.model, ctx.data.train, regularizer=proximal_term(self.mu, anchor))
