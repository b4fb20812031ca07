"""The contract between the runtime and an algorithm.

The runtime drives every node through the same round, with no global barrier:

    fit -> (privacy) -> publish parts -> pushes -> configure_fetch -> gather -> aggregate

A `Strategy` decides *what* happens in each step; the runtime decides *how* bytes move.
Strategies see peers only as `PeerModel`s (tensors plus signed metadata) and never touch
sockets, keys or the wire format, so the same strategy runs in-process in unit tests.
Algorithms may import this module, `p2pfl.training`, `p2pfl.models` and `p2pfl.core`;
they never import `p2pfl.runtime.node` or the transport.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from p2pfl.models import SplitModel
from p2pfl.runtime.run_folder import ArtefactSink
from p2pfl.training import FitResult, LocalTrainer

if TYPE_CHECKING:
    from p2pfl.data import NodeData

COORDINATOR_ID = "coordinator"


@dataclass(frozen=True)
class Fetch:
    """Ask `peer` for its latest version of `part` ("body", "head", "full"; the coordinator serves "global")."""

    peer: str
    part: str


@dataclass(frozen=True)
class Push:
    """Send tensors and metadata to `target` (a peer id or `COORDINATOR_ID`) after this round's fit."""

    target: str
    kind: str
    tensors: Mapping[str, torch.Tensor]
    meta: Mapping[str, Any] = field(default_factory=dict)
    part: str = ""


@dataclass(frozen=True)
class PeerModel:
    """A verified part that arrived from a peer (or the coordinator) this round."""

    sender: str
    part: str
    round: int
    version: int
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]

    @property
    def n_train(self) -> int:
        return int(self.meta.get("n_train", 1))


@dataclass
class RoundContext:
    """Everything a strategy may use in one round. `round` is 1-based; 0 during `setup`."""

    node_id: str
    round: int
    rounds: int
    peers: tuple[str, ...]
    model: SplitModel
    data: "NodeData"
    trainer: LocalTrainer
    rng: np.random.Generator
    artefacts: ArtefactSink
    log: Callable[[str], None] = print
    coordinator: str | None = None
    # The model's state when this round's fit began (output noise and FedProx anchor on it).
    round_start: dict[str, torch.Tensor] = field(default_factory=dict)
    # Peers whose last fetch failed or timed out, for strategies that track liveness.
    unreachable: set[str] = field(default_factory=set)
    # Peers that said goodbye (failed, or out of privacy budget): never asked again.
    departed: set[str] = field(default_factory=set)


class Strategy:
    """Base strategy: local training, share the full model, download nothing, keep own model.

    Subclasses declare their parameters as keyword arguments of `__init__` with defaults;
    the registry validates scenario parameters against that signature.
    """

    name: ClassVar[str] = ""
    needs_coordinator: ClassVar[bool] = False
    # Parts this node serves to peers once per round (encoded once, served many times).
    shared_parts: ClassVar[tuple[str, ...]] = ("full", "body", "head")
    # True: the runtime hands each peer part to `fold` the moment it arrives and keeps none of
    # their tensors; `aggregate` then gets the arrivals without tensors (sender, version, meta).
    folds_arrivals: ClassVar[bool] = False

    def setup(self, ctx: RoundContext) -> None:
        """Once per node before round 1."""

    def state_dict(self) -> dict[str, Any]:
        """What the strategy has learnt across rounds (JSON-able), for checkpoints; parameters are not state."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()` output; a key this strategy does not know is an error, not ignored."""
        if state:
            raise ValueError(f"{type(self).__name__} keeps no state across rounds, got {sorted(state)}")

    def fit(self, ctx: RoundContext) -> FitResult:
        return ctx.trainer.fit(ctx.model, ctx.data.train)

    def shared_meta(self, ctx: RoundContext) -> dict[str, Any]:
        """Metadata published with every part this round (the runtime adds `n_train`)."""
        return {}

    def pushes(self, ctx: RoundContext) -> list[Push]:
        return []

    def configure_fetch(self, ctx: RoundContext) -> list[Fetch]:
        return []

    def fold(self, ctx: RoundContext, arrival: PeerModel) -> bool:
        """One arrival, as it comes (only with `folds_arrivals`); True if it was taken in, and the
        runtime may drop its tensors. Runs on the node's event loop, so keep it cheap."""
        raise NotImplementedError(f"{type(self).__name__} sets folds_arrivals but has no fold")

    def aggregate(self, ctx: RoundContext, arrived: list[PeerModel]) -> None:
        """Update `ctx.model` in place from what arrived (may be fewer than requested)."""
