"""The safeguard's statistics: is the federated model better than the Local one on a node's
validation split? A one-sided sign test on the samples the two models disagree on.

Pure functions of per-sample correctness and counts: the runtime's `LocalSafeguard` applies
them every round, and `p2pfl.report.tables` replays other levels from the recorded evidence.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # tensors only pass through: the schema and the report load this without torch
    import torch

# `algorithm.safeguard_level`: the one-sided level of the sign test, the chance of deploying the
# federated model on a node where it is no better than Local. Lower is safer for the worst node;
# higher deploys the federation on more nodes (docs/experiments.md measures the trade-off).
DEFAULT_LEVEL = 0.05


def evidence_z(level: float) -> float:
    """How many more validation samples, in standard deviations of a fair coin over the samples
    the two models disagree on, the federated model must get right at one-sided `level` in (0, 1)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"a test level is in (0, 1), got {level!r}")
    return NormalDist().inv_cdf(1 - level)


EVIDENCE_Z = evidence_z(DEFAULT_LEVEL)  # 1.645


def disagreements(federated_correct: torch.Tensor, local_correct: torch.Tensor) -> tuple[int, int]:
    """(wins, losses) of the federated model on the samples where exactly one of the two is right."""
    if federated_correct.shape != local_correct.shape:
        raise ValueError(f"scored on different splits: {tuple(federated_correct.shape)} and {tuple(local_correct.shape)}")
    return int((federated_correct & ~local_correct).sum()), int((local_correct & ~federated_correct).sum())


def prefer_federated(wins: int, losses: int, z: float = EVIDENCE_Z) -> bool:
    """Whether `disagreements` on the validation split are evidence that the federated model
    beats the Local one: wins - losses > z * sqrt(wins + losses) (a sign test: under "equally
    good", wins - losses has mean 0 and standard deviation sqrt(wins + losses)). Ties and thin
    evidence keep Local."""
    return wins - losses > z * math.sqrt(wins + losses)
