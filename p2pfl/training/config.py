"""What the scenario's [train] table says, torch-free: the schema checks it before torch loads."""

from __future__ import annotations

from dataclasses import dataclass

from p2pfl.errors import ConfigError

OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 1
    batch_size: int = 32
    optimizer: str = "adam"
    lr: float = 1e-3
    momentum: float = 0.0
    weight_decay: float = 0.0
    # Added to the run's seed for the initial model and every training draw, not for the data
    # split: two runs that differ only here measure training noise on the same partition.
    seed_offset: int = 0

    def __post_init__(self) -> None:
        if self.epochs < 0:
            raise ConfigError("train.epochs", f"must be >= 0, got {self.epochs}")
        if self.batch_size < 1:
            raise ConfigError("train.batch_size", f"must be >= 1, got {self.batch_size}")
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError("train.optimizer", f"unknown optimizer {self.optimizer!r}; choose one of {OPTIMIZERS}")
        if isinstance(self.seed_offset, bool) or not isinstance(self.seed_offset, int) or self.seed_offset < 0:
            raise ConfigError("train.seed_offset", f"must be an integer >= 0, got {self.seed_offset!r}")
        if not self.lr > 0:
            raise ConfigError("train.lr", f"must be > 0, got {self.lr}")
