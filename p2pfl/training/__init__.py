"""Local training and evaluation, shared by every strategy.

Privacy plugs in through `PrivacyMechanism`: DP-SGD wraps model, optimizer and loader for
one fit; output noise perturbs the update before it is published. The trainer knows no
algorithm and no network. `TrainConfig` (config.py) is torch-free; the trainer (trainer.py)
loads torch when it is first named, so checking a scenario never waits for torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from p2pfl.training.config import OPTIMIZERS, TrainConfig

if TYPE_CHECKING:
    from p2pfl.training.trainer import (FitResult, LocalTrainer, PrivacyMechanism, correct_per_sample,
                                        evaluate_logits, rng_state_from_hex, rng_state_hex)

_TRAINER = ("FitResult", "LocalTrainer", "PrivacyMechanism", "correct_per_sample", "evaluate_logits",
            "rng_state_from_hex", "rng_state_hex")


def __getattr__(name: str) -> Any:
    if name in _TRAINER:
        value = getattr(importlib.import_module("p2pfl.training.trainer"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'p2pfl.training' has no attribute {name!r}")


__all__ = ["OPTIMIZERS", "TrainConfig", *_TRAINER]
