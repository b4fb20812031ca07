"""The contract between the coordinator and an algorithm's coordinator half (DI's and Client2Vec's
global steps): what nodes submit, what the half replies, and what it may know of the run. Pure:
no HTTP, no files; `p2pfl.runtime.coordinator` moves the bytes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from p2pfl.models import SplitModel
from p2pfl.runtime.peer_claims import capped_sizes
from p2pfl.runtime.strategy import PartDecl


@dataclass(frozen=True)
class Submission:
    """What one node pushed to the coordinator (one kind, one round or the setup)."""

    node_id: str
    state: dict[str, torch.Tensor]
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Reply:
    """The coordinator's answer to a round (or to the setup exchange).

    `parts` are served to every node, `addressed` (part -> node -> tensors) each to its node
    only; `model` is the new global model when the algorithm has one (the coordinator scores
    it on the held-out domain and checkpoints it); `info` goes into the coordinator's record."""

    parts: dict[str, dict[str, torch.Tensor]]
    meta: dict[str, Any] = field(default_factory=dict)
    addressed: dict[str, dict[str, dict[str, torch.Tensor]]] = field(default_factory=dict)
    model: dict[str, torch.Tensor] | None = None
    info: dict[str, Any] = field(default_factory=dict)


def weighed_as_capped(submissions: list[Submission], max_weight_ratio: float) -> list[Submission]:
    """The round's submissions with each `n_train` capped (`p2pfl.runtime.peer_claims.capped_sizes`):
    one node's claim cannot make it the global model."""
    sized = [i for i, sub in enumerate(submissions) if "n_train" in sub.meta]
    capped = capped_sizes([int(submissions[i].meta["n_train"]) for i in sized], max_weight_ratio)
    out = list(submissions)
    for i, n in zip(sized, capped):
        if n != submissions[i].meta["n_train"]:
            out[i] = dataclasses.replace(submissions[i], meta={**submissions[i].meta, "n_train": n,
                                                               "n_train_claimed": submissions[i].meta["n_train"]})
    return out


@dataclass(frozen=True)
class CoordinatorEnv:
    """What a coordinator half may know of the run: the nodes' model (same initialisation), sizes, seed,
    and the device the coordinator computes on (the scenario's `device`, as node 0 gets it)."""

    model: SplitModel
    rounds: int
    seed: int
    num_classes: int
    nodes: tuple[str, ...]
    device: torch.device = torch.device("cpu")


class CoordinatorHalf:
    """The coordinator side of an algorithm: pure (no HTTP, no files); the service moves bytes.

    A half declares which kind nodes push in the setup exchange (`setup_kind`, answered once
    by `setup`) and every round (`round_kind`, answered by `aggregate`), and what each kind
    must look like (`expected`). Parameters are keyword arguments of `__init__` after `env`,
    validated with the strategy's own."""

    setup_kind: ClassVar[str | None] = None
    round_kind: ClassVar[str | None] = None

    def __init__(self, env: CoordinatorEnv) -> None:
        self.env = env

    def expected(self, kind: str) -> PartDecl | None:
        """The spec and schema of a push of `kind`; None: this half takes no such push."""
        return None

    def setup(self, submissions: list[Submission]) -> Reply:
        raise NotImplementedError(f"{type(self).__name__} declares a setup kind but no setup")

    def aggregate(self, round_: int, submissions: list[Submission]) -> Reply:
        raise NotImplementedError(f"{type(self).__name__} declares a round kind but no aggregate")

    def state_dict(self) -> dict[str, Any]:
        """What the half keeps across rounds (JSON-able), for the coordinator's checkpoints."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"{type(self).__name__} keeps no state across rounds, got {sorted(state)}")
