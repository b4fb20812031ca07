"""What a node runs with: built by `p2pfl.assembly`, or in code by a test (the node builds nothing itself)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from p2pfl.attacks import Attack
from p2pfl.data import NodeData
from p2pfl.models import SplitModel
from p2pfl.runtime.accounting import ByteCounter
from p2pfl.runtime.churn import NodeScript
from p2pfl.runtime.node.peer_directory import PeerDirectory
from p2pfl.runtime.safeguard import Safeguard
from p2pfl.runtime.settings import NodeSettings
from p2pfl.runtime.strategy import Strategy
from p2pfl.runtime.transport import Transport
from p2pfl.training.trainer import LocalTrainer, PrivacyMechanism
from p2pfl.wire import NodeKey



class NodeHandle(Protocol):
    """What a companion may know and do of its node: its peer directory (`peers`: the one writer of
    membership), how it arrived ("fresh", "resume", "join"), its settings, its round, and how to
    stop it before its next round."""

    peers: PeerDirectory
    arrival: str
    settings: NodeSettings

    @property
    def round(self) -> int: ...

    def stop_soon(self, status: str, reason: str) -> None: ...


class Companion(Protocol):
    """What runs beside a node while it listens, and changes whom it knows (a federation's member
    exchange, `p2pfl.runtime.federation.service`): started once its port is open, before round 1
    (it may wait there for members), stopped before the port closes; its `summary` goes into the
    node's result under its `name`."""

    name: str

    async def start(self, node: NodeHandle) -> None: ...

    async def stop(self) -> None: ...

    def summary(self) -> dict[str, Any]: ...


@dataclass
class NodeParts:
    data: NodeData
    device: torch.device
    model: SplitModel
    trainer: LocalTrainer
    strategy: Strategy
    fresh_strategy: Callable[[], Strategy]  # a new one with the same parameters: restore tries a checkpoint on it first
    privacy: PrivacyMechanism | None        # p2pfl.privacy's DP-SGD or output noise, or None
    attack: Attack | None
    key: NodeKey
    transport: Transport
    counter: ByteCounter
    neighbours: tuple[str, ...]             # whom this node fetches from and waits for at first (runtime.topology)
    seed: int
    safeguard: Safeguard = field(default_factory=Safeguard)  # algorithm.safeguard: none, MixSafeguard, LocalSafeguard
    # Under partial participation: the rounds each neighbour takes part in (`p2pfl.runtime.participation`).
    peer_rounds: Mapping[str, frozenset[int]] = field(default_factory=dict)
    script: NodeScript = NodeScript()       # its part of the churn schedule ([churn])
    joins_late: frozenset[str] = frozenset()  # neighbours that join after round 1: not waited for at the start
    companions: tuple[Companion, ...] = ()
