"""FedAvgM and the FedOpt family (FedAdagrad, FedAdam, FedYogi), peer to peer.

Flower runs these on its server; here every node runs its own: its FedAvg aggregate (the own
model and its neighbours', any of FedAvg's aggregation rules) minus the model its round started
from is the round's pseudo-gradient, and the node's server optimiser (`p2pfl.core.server_opt`)
steps from that start. Its moments are the strategy's state, checkpointed as tensors.

Defaults: FedAvgM η = 1, β = 0.9 (Hsu et al. 2019, "Measuring the effects of non-identical data
distribution"); FedAdagrad η = 0.1, β₁ = 0, τ = 1e-9; FedAdam η = 0.1, β₁ = 0.9, β₂ = 0.99,
τ = 1e-9; FedYogi η = 0.01, β₁ = 0.9, β₂ = 0.99, τ = 1e-3 (Reddi et al., ICLR 2021, "Adaptive
federated optimization", who tune η and τ per task: choose them on validation data).
"""

from __future__ import annotations

from typing import Any

import torch

from p2pfl.algorithms import register
from p2pfl.algorithms.fedavg import FedAvg
from p2pfl.core.server_opt import ServerOptimizer
from p2pfl.models import load_part, part_state
from p2pfl.runtime.strategy import PeerModel, RoundContext


class FedOpt(FedAvg):
    """FedAvg's aggregate as a pseudo-gradient for a server optimiser of the node's own."""

    kind = ""

    def __init__(self, server_lr: float, beta1: float, beta2: float, tau: float, aggregation: str = "mean",
                 trim: float = 0.1, staleness: float = 0.0, byzantine: int = 1, keep: int = 0, fallback: bool = False) -> None:
        super().__init__(aggregation, trim, staleness, byzantine, keep, fallback)
        self.optimizer = ServerOptimizer(self.kind, float(server_lr), float(beta1), float(beta2), float(tau))

    def aggregate(self, ctx: RoundContext, arrived: list[PeerModel]) -> None:
        start = dict(ctx.round_start) if ctx.round_start else {k: v.detach().clone() for k, v in part_state(ctx.model, "full").items()}
        super().aggregate(ctx, arrived)
        load_part(ctx.model, self.optimizer.step(start, part_state(ctx.model, "full")))

    def state_dict(self) -> dict[str, Any]:
        return {"m": dict(self.optimizer.m), "v": dict(self.optimizer.v)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("m", "v"):
            moments = state.get(name) or {}
            if not all(isinstance(t, torch.Tensor) for t in moments.values()):
                raise ValueError(f"{self.name}'s state {name!r} must map parameter names to tensors")
            setattr(self.optimizer, name, {k: t.double() for k, t in moments.items()})


@register
class FedAvgM(FedOpt):
    name, kind = "fedavgm", "momentum"

    def __init__(self, server_lr: float = 1.0, momentum: float = 0.9, aggregation: str = "mean", trim: float = 0.1,
                 staleness: float = 0.0, byzantine: int = 1, keep: int = 0, fallback: bool = False) -> None:
        super().__init__(server_lr, momentum, 0.0, 1e-9, aggregation, trim, staleness, byzantine, keep, fallback)


@register
class FedAdagrad(FedOpt):
    name, kind = "fedadagrad", "adagrad"

    def __init__(self, server_lr: float = 0.1, beta1: float = 0.0, tau: float = 1e-9, aggregation: str = "mean",
                 trim: float = 0.1, staleness: float = 0.0, byzantine: int = 1, keep: int = 0, fallback: bool = False) -> None:
        super().__init__(server_lr, beta1, 0.0, tau, aggregation, trim, staleness, byzantine, keep, fallback)


@register
class FedAdam(FedOpt):
    name, kind = "fedadam", "adam"

    def __init__(self, server_lr: float = 0.1, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-9,
                 aggregation: str = "mean", trim: float = 0.1, staleness: float = 0.0, byzantine: int = 1,
                 keep: int = 0, fallback: bool = False) -> None:
        super().__init__(server_lr, beta1, beta2, tau, aggregation, trim, staleness, byzantine, keep, fallback)


@register
class FedYogi(FedOpt):
    name, kind = "fedyogi", "yogi"

    def __init__(self, server_lr: float = 0.01, beta1: float = 0.9, beta2: float = 0.99, tau: float = 1e-3,
                 aggregation: str = "mean", trim: float = 0.1, staleness: float = 0.0, byzantine: int = 1,
                 keep: int = 0, fallback: bool = False) -> None:
        super().__init__(server_lr, beta1, beta2, tau, aggregation, trim, staleness, byzantine, keep, fallback)
