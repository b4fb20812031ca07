"""The carrier a scenario asks for (`runtime.transport`), built the same way for a node and the coordinator."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from p2pfl.runtime.accounting import ByteCounter
from p2pfl.runtime.peers import PeerInfo
from p2pfl.runtime.tls import server_context
from p2pfl.runtime.transport import ServerLimits, Transport, TransportSettings, build_transport
from p2pfl.scenario.schema import Scenario
from p2pfl.wire import NodeKey, Roster, WireLimits


def build_carrier(sc: Scenario, node_id: str, key: NodeKey, peers: Mapping[str, PeerInfo], counter: ByteCounter,
                  log: logging.Logger | None = None) -> Transport:
    """The `runtime.transport` carrier of one node or the coordinator: whom it trusts and reaches, and its limits."""
    rt = sc.runtime
    return build_transport(rt.transport, TransportSettings(
        node_id=node_id, key=key, roster=Roster({pid: info.public_key for pid, info in peers.items()}),
        urls={pid: info.url for pid, info in peers.items()}, counter=counter,
        limits=WireLimits(max_message_bytes=int(rt.message_limit_mb * 2**20)),
        max_skew_s=rt.max_skew_s, retry_s=rt.connect_retry_s,
        server_limits=ServerLimits(max_buffered_body_bytes=int(rt.buffered_mb * 2**20)),
        held_bytes=int(rt.held_mb * 2**20),
        tls=server_context(key, node_id) if rt.tls else None,
        pins={pid: info.tls_fingerprint for pid, info in peers.items() if info.tls_fingerprint},
        log=log or logging.getLogger(f"p2pfl.{node_id}"),
    ))
