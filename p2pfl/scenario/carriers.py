"""The carrier a scenario asks for (`runtime.transport`), built the same way for a node and the coordinator."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import replace
from collections.abc import Mapping

from p2pfl.runtime.accounting import ByteCounter
from p2pfl.runtime.peers import COORDINATOR_ID, PeerInfo
from p2pfl.runtime.tls import server_context
from p2pfl.runtime.transport import ServerLimits, Transport, TransportSettings, build_transport
from p2pfl.scenario.schema import Scenario
from p2pfl.runtime.shared_tables import overlay_of
from p2pfl.wire import NodeKey, Roster, WireLimits, roster_key


def server_limits(sc: Scenario, node_id: str, peers: int) -> ServerLimits:
    """What this endpoint's server grants. The coordinator is read by every node at once (each
    long-polls for its reply while others still push): its open-connection cap grows with the
    nodes, or at 1000 nodes the first 512 waiting readers shut the rest of the setup out."""
    limits = ServerLimits(max_buffered_body_bytes=int(sc.runtime.buffered_mb * 2**20))
    if node_id == COORDINATOR_ID:
        limits = replace(limits, max_connections=max(limits.max_connections, 2 * peers + 64))
    return limits


def run_tag(sc: Scenario) -> str:
    """What binds a member's signed statements (goodbye, return) to this run: its name, seed, rounds
    and algorithm, the same on every host of a federation (paths and ports may differ)."""
    what = [sc.name, sc.seed, sc.rounds, sc.algorithm.name]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:16]


# One function object each: the tables derived from a roster shared by a worker's nodes are made once.
def _roster_key(info: PeerInfo) -> bytes:
    return roster_key(info.public_key)


def _url(info: PeerInfo) -> str:
    return info.url


def build_carrier(sc: Scenario, node_id: str, key: NodeKey, peers: Mapping[str, PeerInfo], counter: ByteCounter,
                  log: logging.Logger | None = None) -> Transport:
    """The `runtime.transport` carrier of one node or the coordinator: whom it trusts and reaches, and its limits."""
    rt = sc.runtime
    return build_transport(rt.transport, TransportSettings(
        node_id=node_id, key=key, roster=Roster.over(overlay_of(peers, _roster_key)),
        urls=overlay_of(peers, _url), counter=counter,
        limits=WireLimits(max_message_bytes=int(rt.message_limit_mb * 2**20)),
        max_skew_s=rt.max_skew_s, retry_s=rt.connect_retry_s,
        server_limits=server_limits(sc, node_id, len(peers)),
        held_bytes=int(rt.held_mb * 2**20),
        tls=server_context(key, node_id) if rt.tls else None,
        pins={pid: info.tls_fingerprint for pid, info in peers.items() if info.tls_fingerprint} if rt.tls else {},
        log=log or logging.getLogger(f"p2pfl.{node_id}"), run=run_tag(sc),
    ))
