"""How a node reaches its peers: the `Transport` protocol, and a registry of carriers.

A node and the coordinator hold a `Transport`, never a carrier's class. Carriers are built by
name from `runtime.transport` (`build_transport`):

* `"http"` (`p2pfl.runtime.transport.http`): signed frames over HTTP(S), between processes and
  machines; every placement and the LAN use it.
* `"loopback"` (`p2pfl.runtime.transport.loopback`): the same sealed, signed and verified frames
  handed over in memory, between nodes of one process (placement "shared" with one worker, and
  tests). Bytes and rejections count as over HTTP; only the socket is gone.
* `"colocated"` (`p2pfl.runtime.transport.colocated`): HTTP, except to peers started in the same
  process and event loop, which it reaches in memory as loopback does (the workers of placement
  "shared"): any placement, the coordinator and the LAN over HTTP as before.

A new carrier is one module with a factory `(TransportSettings) -> Transport` (its class), registered by a
line in `CARRIERS` below (with its address format in `CARRIER_ADDRESSES`, `transport.addresses`), or
by `register_transport`, or named in a scenario as `runtime.transport = "pkg.module:factory"`;
`tests/runtime/transport_contract.py` is the suite it must pass.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from p2pfl.runtime.accounting import ByteCounter
from p2pfl.runtime.metadata import Schema
from p2pfl.runtime.rejections import RejectionLog
from p2pfl.runtime.statements import Statement
from p2pfl.runtime.transport.addresses import HTTP, LOOPBACK, AddressFormat, register_address_format
from p2pfl.runtime.transport.limits import ServerLimits
from p2pfl.runtime.transport.stores import DEFAULT_HELD_BYTES, SETUP_PREFIX
from p2pfl.wire import Message, NodeKey, ReplayGuard, Roster, WireLimits

ExpectedTensors = Mapping[str, tuple[tuple[int, ...], str]]  # name -> (shape, dtype) a part must have


class Transport(Protocol):
    peers: Mapping[str, str]          # peer id -> where it is reached
    departed: Mapping[str, str]       # peer id -> why it said goodbye
    replay: ReplayGuard               # what was accepted from whom (checkpointed, so a restart refuses replays)
    rejections: RejectionLog          # what was refused, and why

    def attach(self, *, expected_for: Callable[[str, str], ExpectedTensors | None], on_message: Callable[[Message], None],
               status: Callable[[], dict[str, Any]], meta_schema_for: Callable[[str, str], Schema | None],
               on_departed: Callable[[str, str], None] | None = None,
               on_statement: Callable[[Statement], None] | None = None) -> None:
        """Who judges and takes what arrives (the node), set once before `start`."""

    async def start(self, host: str, port: int) -> None:
        """Serve at (host, port) and reach peers from now on."""

    async def listen(self) -> None:
        """Serve again at the address given to `start` (a node that comes back after `stop_listening`)."""

    async def stop_listening(self) -> None:
        """Stop dead, as a crashed process: the address refuses connections and what was
        published is gone; peers are told nothing. Reaching peers still works."""

    async def close(self) -> None: ...

    async def publish(self, version: int, round_: int, parts: Mapping[str, Mapping[str, Any]],
                      meta: Mapping[str, Any], addressed: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None) -> None:
        """Serve `parts` as this node's `version` until the next publish; `addressed` parts
        (part -> node -> tensors) each to its node only. "setup.*" parts have their own versions."""

    def expect_readers(self, readers: Iterable[str]) -> None:
        """Who reads this node's round parts (its neighbours), so that versions
        all of them have read past can go."""

    def readers(self) -> set[str]:
        """The peers that read, or are expected to read, this node's round parts."""

    async def sit_out(self, round_: int) -> None:
        """Answer `round_`'s reads at once with the last version: this node skips that round."""

    async def withdraw(self) -> None:
        """Stop serving (a failed node): waiting readers get nothing rather than a broken model."""

    async def fetch(self, peer: str, part: str, min_version: int, timeout: float) -> Message | None: ...

    async def push(self, target: str, *, kind: str, part: str, round_: int, version: int,
                   tensors: Mapping[str, Any], meta: Mapping[str, Any], timeout: float) -> bool: ...

    async def say_goodbye(self, targets: list[str], reason: str, before_round: int, timeout: float = 3.0) -> None: ...

    async def say_back(self, targets: Iterable[str], first_round: int, timeout: float = 3.0) -> Statement: ...

    def own_statement(self, event: int) -> Statement: ...

    def take_back(self, statement: Statement) -> None: ...

    async def status_of(self, peer: str, timeout: float = 2.0) -> dict[str, Any] | None: ...

    async def wait_until_up(self, peers: set[str], seconds: float) -> set[str]: ...

    async def linger(self, peers: set[str], seconds: float, not_up_yet: Iterable[str] = ()) -> None: ...


@dataclass(frozen=True)
class TransportSettings:
    """Everything a carrier is built from: who this node is, whom it trusts and reaches, and its limits."""

    node_id: str
    key: NodeKey
    roster: Roster
    urls: Mapping[str, str]             # peer id -> address (the carrier reads its own kind)
    counter: ByteCounter
    limits: WireLimits
    max_skew_s: float = 300.0           # accepted clock difference for message timestamps
    retry_s: float = 0.25               # first back-off between tries to reach a peer
    server_limits: ServerLimits = ServerLimits()
    held_bytes: float = DEFAULT_HELD_BYTES
    tls: Any = None                     # an ssl.SSLContext for HTTPS (http only)
    pins: Mapping[str, str] = field(default_factory=dict)  # peer id -> certificate fingerprint (http only)
    log: logging.Logger | None = None
    run: str = ""                       # this run's tag: signed membership statements are bound to it


TransportFactory = Callable[[TransportSettings], Transport]

# name -> "module:factory", imported only when built (the launcher never loads aiohttp).
CARRIERS: dict[str, str] = {
    "http": "p2pfl.runtime.transport.http:Endpoint",
    "loopback": "p2pfl.runtime.transport.loopback:LoopbackCarrier",
    "colocated": "p2pfl.runtime.transport.colocated:ColocatedEndpoint",
}
# name -> how its nodes' addresses are written and read (a kind named "pkg.module:factory": HTTP's)
CARRIER_ADDRESSES: dict[str, AddressFormat] = {"http": HTTP, "loopback": LOOPBACK, "colocated": HTTP}
_BUILT: dict[str, TransportFactory] = {}


def register_transport(name: str, factory: TransportFactory, addresses: AddressFormat = HTTP) -> None:
    """Make `runtime.transport = name` build carriers with `factory` (in this process), its nodes
    reached at `addresses`' addresses."""
    _BUILT[name] = factory
    CARRIERS.setdefault(name, f"{getattr(factory, '__module__', '?')}:{getattr(factory, '__qualname__', '?')}")
    CARRIER_ADDRESSES[name] = addresses
    register_address_format(addresses)


def addresses_of(name: str) -> AddressFormat:
    """The address format of carrier kind `name`."""
    return CARRIER_ADDRESSES.get(name, HTTP)


def transport_factory(name: str) -> TransportFactory:
    """The factory `runtime.transport = name` builds with: a registered name or "pkg.module:factory"."""
    if name in _BUILT:
        return _BUILT[name]
    target = CARRIERS.get(name, name if ":" in name else None)
    if target is None:
        raise ValueError(f"unknown transport {name!r}; choose one of {sorted(CARRIERS)} or name one as "
                         "'pkg.module:factory'")
    module_name, _, attr = target.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"transport {name!r}: cannot load {target} ({exc})") from exc
    if not callable(factory):
        raise ValueError(f"transport {name!r}: {target} is not callable")
    _BUILT[name] = factory
    return factory


def build_transport(name: str, settings: TransportSettings) -> Transport:
    """A carrier for one node (or the coordinator), by its registered name."""
    return transport_factory(name)(settings)


__all__ = ["CARRIERS", "SETUP_PREFIX", "ExpectedTensors", "ServerLimits", "Transport", "TransportFactory",
           "TransportSettings", "build_transport", "register_transport", "transport_factory"]
