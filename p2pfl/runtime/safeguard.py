"""The safeguard (`algorithm.safeguard = true`): no node worse off for joining.

After aggregation a node scores mixes `w * aggregate + (1 - w) * own` of the aggregate and
its own freshly trained model on its validation split, for w on a small grid (0 is its own
model, 1 the aggregate), and keeps the best: highest validation accuracy, then lowest loss,
then the largest w (on a tie the node keeps learning from its peers). Knows no algorithm:
it only sees two state dicts and a scoring function, so it applies to every strategy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

GRID = (0.0, 0.25, 0.5, 0.75, 1.0)

State = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class SafeguardChoice:
    weight: float  # of the aggregate in the kept model
    scores: dict[float, tuple[float, float]]  # weight -> (validation accuracy, loss)

    @property
    def kept_own(self) -> bool:
        return self.weight == 0.0


def mix(own: State, aggregate: State, weight: float) -> dict[str, torch.Tensor]:
    """`weight * aggregate + (1 - weight) * own` for floating tensors; integer buffers (BatchNorm's
    counter) from whichever side has the larger weight."""
    out = {}
    for name, a in aggregate.items():
        o = own[name]
        if a.is_floating_point():
            out[name] = torch.lerp(o, a, weight) if 0.0 < weight < 1.0 else (a if weight == 1.0 else o).clone()
        else:
            out[name] = (a if weight >= 0.5 else o).clone()
    return out


def choose(own: State, aggregate: State, score: Callable[[Mapping[str, torch.Tensor]], tuple[float, float]],
           grid: Sequence[float] = GRID) -> SafeguardChoice:
    """The best mix on `grid` by `score(state) -> (accuracy, loss)`."""
    scores = {w: score(mix(own, aggregate, w)) for w in grid}
    best = max(scores, key=lambda w: (scores[w][0], -scores[w][1], w))
    return SafeguardChoice(best, scores)
