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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
import torch

from p2pfl.models import SplitModel
from p2pfl.runtime.metadata import Schema
from p2pfl.runtime.peers import COORDINATOR_ID  # noqa: F401  (strategies address the coordinator by it)
from p2pfl.runtime.run_folder import ArtefactSink
from p2pfl.runtime.transport.stores import SETUP_PREFIX
from p2pfl.training.trainer import FitResult, LocalTrainer

if TYPE_CHECKING:
    from p2pfl.data import NodeData


TensorSpec = dict[str, tuple[tuple[int, ...], str]]  # name -> (shape, dtype) a part must have


def setup_part(name: str) -> str:
    """The wire name of a setup part (served apart from the rounds' parts)."""
    return name if name.startswith(SETUP_PREFIX) else SETUP_PREFIX + name


@dataclass(frozen=True)
class PartDecl:
    """What a part outside the model's own ("full", "body", "head") must look like on arrival."""

    spec: TensorSpec
    meta: Schema | None = None


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
class RunResults:
    """An earlier run's results.json, as the scenario layer read it for a `Strategy.reads_runs` parameter."""

    path: str
    document: Mapping[str, Any]


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


class SetupExchange(Protocol):
    """Messages before round 1, for `Strategy.setup` (blocking calls, made from its worker thread).

    Setup parts are named "setup.<name>" and versioned by setup `step` (1, 2, ...), apart from
    the rounds. A fetch of step s waits for the peer's (or the coordinator's) step >= s.

    `late`: this node arrives after round 1 (a joiner), when the coordinator's setup is over and
    its fetches wait `fetch_timeout_s`, not `setup_wait_s`; `joiners`: the run brings nodes in
    later, so what a joiner needs from its peers' setup should be served to it."""

    late: bool
    joiners: bool

    def publish(self, step: int, parts: Mapping[str, Mapping[str, torch.Tensor]], meta: Mapping[str, Any]) -> None: ...

    def push(self, step: int, pushes: Sequence["Push"]) -> None: ...

    def fetch(self, step: int, fetches: Sequence["Fetch"]) -> list["PeerModel"]: ...

    def first(self, step: int, part: str, peers: Sequence[str]) -> "PeerModel | None": ...


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
    # The setup exchange (only during `setup`, only under the runtime; None in unit tests).
    exchange: SetupExchange | None = None
    seed: int = 0  # the scenario's seed: the same on every node (shared draws, encoders)


def overrides(obj: object, base: type, hook: str) -> bool:
    """Whether `obj` does something in `hook`: the base class's is a no-op, not worth a thread hop
    (each is tens of microseconds, and a worker runs thousands of rounds)."""
    return getattr(type(obj), hook) is not getattr(base, hook)


class Strategy:
    """Base strategy: local training, share the full model, download nothing, keep own model.

    Subclasses declare their parameters as keyword arguments of `__init__` with defaults;
    the registry validates scenario parameters against that signature.
    """

    name: ClassVar[str] = ""
    # The algorithm's coordinator half, for algorithms with a global step; None: peer to peer only.
    coordinator: ClassVar[type | None] = None  # its CoordinatorHalf subclass (runtime/coordinator_half.py)
    # Parts this node serves to peers once per round (encoded once, served many times).
    shared_parts: ClassVar[tuple[str, ...]] = ("full", "body", "head")
    # True: the runtime hands each peer part to `fold` the moment it arrives and keeps none of
    # their tensors; `aggregate` then gets the arrivals without tensors (sender, version, meta).
    # An instance may set it from its parameters (FedAvg's robust rules need every model at once).
    folds_arrivals: bool = False
    # Parameters that name an earlier run's results.json ("{seed}" stands for the run's seed): the
    # scenario layer reads each and hands the strategy a `RunResults`, so no algorithm reads files.
    reads_runs: ClassVar[tuple[str, ...]] = ()
    # True: a node that arrives after round 1 can run `setup` from its peers (`ctx.exchange.late`),
    # the coordinator's setup exchange being over by then; False refuses churn with such a coordinator.
    setup_for_joiners: ClassVar[bool] = False

    @property
    def needs_coordinator(self) -> bool:
        return self.coordinator is not None

    def setup(self, ctx: RoundContext) -> None:
        """Once per node before round 1; may talk to peers and the coordinator through `ctx.exchange`.

        Not called again when a node resumes from a checkpoint: what it builds belongs in `state_dict`."""

    def privacy_conflict(self, mode: str) -> str | None:
        """Why this strategy, as configured, cannot run under privacy `mode` (None: it can)."""
        return None

    def topology_conflict(self, models_per_node: int) -> str | None:
        """Why this strategy, as configured, cannot run where the topology gives some node at most
        `models_per_node` models a round, its own included (None: it can). Checked at launch; a
        strategy that falls back at run time instead (churn) records `fell_back` in its artefacts."""
        return None

    def extra_parts(self, model: SplitModel) -> dict[str, PartDecl]:
        """Parts besides the model's own this node may receive (the coordinator's replies, setup
        parts), with the spec and metadata schema each is checked against on arrival."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What the strategy has learnt in `setup` and across rounds (JSON-able), for checkpoints;
        parameters are not state."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()` output; a key this strategy does not know is an error, not ignored."""
        if state:
            raise ValueError(f"{type(self).__name__} keeps no state across rounds, got {sorted(state)}")

    def fit(self, ctx: RoundContext) -> FitResult:
        return ctx.trainer.fit(ctx.model, ctx.data.train)

    def fit_config(self, ctx: RoundContext) -> Mapping[str, Any]:
        """This round's local-training settings over the scenario's `[train]` (Flower's
        `on_fit_config_fn`), as fields of `p2pfl.training.TrainConfig`: `{"lr": 0.01 * 0.95 **
        (ctx.round - 1)}`, `{"epochs": 1 if ctx.round > 10 else 5}`. The round's record keeps them."""
        return {}

    def evaluate(self, ctx: RoundContext) -> Mapping[str, float]:
        """Metrics of the node's model after aggregation (Flower's `evaluate_fn`, run by every node
        on its own data), kept in the round's record under `metrics`."""
        return {}

    def peer_scores(self, ctx: RoundContext) -> Mapping[str, float]:
        """After `aggregate`: how much this node trusts each peer it has judged, higher is more
        (pFedSV's relevance, FedC2I's influence λ). The round's record keeps them and the run's
        trust summary (`p2pfl.scenario.trust`) ranks peers by their mean; none: ranked by the
        runtime's own evidence (answered, not pulled back, not refused)."""
        return {}

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
