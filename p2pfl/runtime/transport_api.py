"""What a node and the coordinator need from a transport, and nothing more.

`runtime.transport.Endpoint` (signed frames over HTTP) is the one implementation; every
placement uses it between nodes. Node and coordinator hold a `Transport`, never an
`Endpoint`, so a different carrier (an in-memory one for tests, QUIC) changes one place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from p2pfl.runtime.metadata import Schema
from p2pfl.runtime.rejections import RejectionLog
from p2pfl.wire import Message, ReplayGuard

#: Parts published before round 1 (Strategy.setup's exchange) are named "setup.<name>".
SETUP_PREFIX = "setup."

ExpectedTensors = Mapping[str, tuple[tuple[int, ...], str]]  # name -> (shape, dtype) a part must have


class Transport(Protocol):
    peers: Mapping[str, str]          # peer id -> where it is reached
    departed: Mapping[str, str]       # peer id -> why it said goodbye
    replay: ReplayGuard               # what was accepted from whom (checkpointed, so a restart refuses replays)
    rejections: RejectionLog          # what was refused, and why

    def attach(self, *, expected_for: Callable[[str, str], ExpectedTensors | None], on_message: Callable[[Message], None],
               status: Callable[[], dict[str, Any]], meta_schema_for: Callable[[str, str], Schema | None],
               on_departed: Callable[[str, str], None] | None = None) -> None:
        """Who judges and takes what arrives (the node), set once before `start`."""

    async def start(self, host: str, port: int) -> None: ...

    async def close(self) -> None: ...

    async def publish(self, version: int, round_: int, parts: Mapping[str, Mapping[str, Any]],
                      meta: Mapping[str, Any], addressed: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None) -> None:
        """Serve `parts` as this node's `version` until the next publish; `addressed` parts
        (part -> node -> tensors) each to its node only. "setup.*" parts have their own versions."""

    async def sit_out(self, round_: int) -> None:
        """Answer `round_`'s reads at once with the last version: this node skips that round."""

    async def withdraw(self) -> None:
        """Stop serving (a failed node): waiting readers get nothing rather than a broken model."""

    async def fetch(self, peer: str, part: str, min_version: int, timeout: float) -> Message | None: ...

    async def push(self, target: str, *, kind: str, part: str, round_: int, version: int,
                   tensors: Mapping[str, Any], meta: Mapping[str, Any], timeout: float) -> bool: ...

    async def say_goodbye(self, targets: list[str], reason: str, timeout: float = 3.0) -> None: ...

    async def status_of(self, peer: str, timeout: float = 2.0) -> dict[str, Any] | None: ...

    async def wait_until_up(self, peers: set[str], seconds: float) -> set[str]: ...

    async def linger(self, peers: set[str], seconds: float) -> None: ...
