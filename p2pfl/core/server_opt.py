"""Server-side optimisers over a pseudo-gradient: FedAvgM (Hsu et al. 2019) and the FedOpt family,
FedAdagrad, FedAdam and FedYogi (Reddi et al., ICLR 2021, Algorithm 2).

A round's pseudo-gradient is Δ = x̄ − x, the aggregate minus the model the round started from.
With m and v kept across rounds (zeros at first, as Flower initialises them):

    FedAvgM:     m ← β m + Δ                           x ← x + η m
    FedAdagrad:  m ← β₁ m + (1 − β₁) Δ;  v ← v + Δ²                           x ← x + η m / (√v + τ)
    FedAdam:     m ← β₁ m + (1 − β₁) Δ;  v ← β₂ v + (1 − β₂) Δ²               x ← x + η m / (√v + τ)
    FedYogi:     m ← β₁ m + (1 − β₁) Δ;  v ← v − (1 − β₂) Δ² sign(v − Δ²)     x ← x + η m / (√v + τ)

No bias correction (the paper's Algorithm 2 has none). FedAvgM with β = 0 and η = 1 is FedAvg.
Only floating tensors move; others take the aggregate's value. Pure math over tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

SERVER_OPTIMIZERS = ("momentum", "adagrad", "adam", "yogi")
State = Mapping[str, torch.Tensor]


@dataclass
class ServerOptimizer:
    kind: str
    lr: float = 1.0        # η
    beta1: float = 0.9     # β₁ (FedAvgM: its momentum β)
    beta2: float = 0.99    # β₂
    tau: float = 1e-9      # τ, the adaptivity floor
    m: dict[str, torch.Tensor] = field(default_factory=dict)
    v: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in SERVER_OPTIMIZERS:
            raise ValueError(f"unknown server optimizer {self.kind!r}; choose one of {SERVER_OPTIMIZERS}")
        if not self.lr > 0 or not 0 <= self.beta1 < 1 or not 0 <= self.beta2 < 1 or not self.tau > 0:
            raise ValueError(f"need server lr > 0, 0 <= beta1, beta2 < 1 and tau > 0; got {self.lr}, {self.beta1}, "
                             f"{self.beta2}, {self.tau}")

    def step(self, start: State, aggregate: State) -> dict[str, torch.Tensor]:
        """The next model from the round's start and its aggregate; updates m and v."""
        out: dict[str, torch.Tensor] = {}
        for k, target in aggregate.items():
            if not target.is_floating_point():
                out[k] = target.detach().clone()
                continue
            x = start[k].detach().to(target.device, torch.float64)
            delta = target.detach().double() - x
            m = self.m.get(k, torch.zeros_like(delta)).to(delta.device, torch.float64)
            if self.kind == "momentum":
                m = self.beta1 * m + delta
                self.m[k] = m
                out[k] = (x + self.lr * m).to(target.dtype)
                continue
            m = self.beta1 * m + (1 - self.beta1) * delta
            v = self.v.get(k, torch.zeros_like(delta)).to(delta.device, torch.float64)
            squared = delta * delta
            if self.kind == "adagrad":
                v = v + squared
            elif self.kind == "adam":
                v = self.beta2 * v + (1 - self.beta2) * squared
            else:
                v = v - (1 - self.beta2) * squared * torch.sign(v - squared)
            self.m[k], self.v[k] = m, v
            out[k] = (x + self.lr * m / (v.sqrt() + self.tau)).to(target.dtype)
        return out
