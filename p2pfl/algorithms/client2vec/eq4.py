"""Client2Vec's eq. 4 in local training: a projection P of the body's features z, orthogonal to
every node's feature index, and a second classifier distilled from the head (`Client2Vec.fit`)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from p2pfl.core.client2vec import distillation, orthogonality_to_indices
from p2pfl.models import SplitModel


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

