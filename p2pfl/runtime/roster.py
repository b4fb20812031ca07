"""The roster of a LAN deployment: every node's id, URL and public key, shared by all hosts.

    # roster.toml: the same file on every host. A node's position is its index, that is,
    # which slice of the scenario's partition it holds.
    [[node]]
    id = "node-0"
    url = "http://192.0.2.10:9000"
    public_key = "<64 hex characters, printed by `p2pfl keygen node-0`>"

    [coordinator]               # only for algorithms with a global step (DI, GA, fedavg_global)
    url = "http://192.0.2.20:9100"
    public_key = "..."

Private keys never appear here: each host makes its own (`p2pfl keygen`), and only the public
line travels. `p2pfl roster check` validates a roster and probes every host.
"""

from __future__ import annotations

import asyncio
import functools
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w

from p2pfl.errors import ConfigError
from p2pfl.runtime.deadline import wait_at_most
from p2pfl.runtime.peers import COORDINATOR_ID, PeerInfo, parse_peer
from p2pfl.runtime.transport.addresses import parse_address

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROSTER_FILE = "roster.toml"  # the name `p2pfl lan` gives it
_ENTRY_FIELDS = ("id", "url", "public_key", "tls_fingerprint")


@dataclass(frozen=True)
class RosterFile:
    """Nodes in index order, and the coordinator if the deployment has one."""

    path: Path
    nodes: dict[str, PeerInfo]
    coordinator: PeerInfo | None = None

    def index(self, node_id: str) -> int:
        return self._indices[node_id]

    @functools.cached_property
    def _indices(self) -> dict[str, int]:
        return {nid: i for i, nid in enumerate(self.nodes)}

    def entry(self, node_id: str) -> PeerInfo:
        if node_id == COORDINATOR_ID and self.coordinator is not None:
            return self.coordinator
        if node_id not in self.nodes:
            known = list(self.nodes) + ([COORDINATOR_ID] if self.coordinator else [])
            raise ConfigError("id", f"{node_id!r} is not in the roster {self.path} (it lists {', '.join(known)})")
        return self.nodes[node_id]


def load_roster(path: str | Path) -> RosterFile:
    """Parse and validate a roster file; every problem is a ConfigError naming the file and entry.

    Read once per process while the file stays as it is (same size and modification time): the
    nodes a worker hosts share one roster instead of each parsing all N entries."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("roster", f"file not found: {path}")
    stat = path.stat()
    return _parsed_roster(path.resolve(), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _parsed_roster(path: Path, mtime_ns: int, size: int) -> RosterFile:
    try:
        raw = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError("roster", f"{path} cannot be parsed: {exc}") from None
    for key in raw:
        if key not in ("node", "coordinator"):
            raise ConfigError(f"{path}: {key}", "unknown field; a roster has [[node]] entries and an optional [coordinator]")
    entries = raw.get("node")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{path}: node", "expected one or more [[node]] entries (id, url, public_key)")
    nodes: dict[str, PeerInfo] = {}
    seen_urls: dict[str, str] = {}
    seen_keys: dict[str, str] = {}
    for i, entry in enumerate(entries):
        where = f"{path}: node[{i}]"
        if not isinstance(entry, Mapping):
            raise ConfigError(where, "expected a table with id, url and public_key")
        node_id = entry.get("id")
        if not isinstance(node_id, str) or not node_id or node_id == COORDINATOR_ID:
            raise ConfigError(f"{where}.id", f"expected a non-empty id other than {COORDINATOR_ID!r}, got {node_id!r}")
        if node_id in nodes:
            raise ConfigError(f"{where}.id", f"duplicate id {node_id!r} (also node[{list(nodes).index(node_id)}])")
        info = parse_peer({k: v for k, v in entry.items() if k != "id"}, f"{path}: node {node_id}")
        _unique(seen_urls, _endpoint(info.url), node_id, f"{path}: node {node_id}.url", "address")
        _unique(seen_keys, info.public_key, node_id, f"{path}: node {node_id}.public_key", "public key")
        nodes[node_id] = info
    coordinator = None
    if raw.get("coordinator") is not None:
        coordinator = parse_peer(raw["coordinator"], f"{path}: coordinator")
        _unique(seen_urls, _endpoint(coordinator.url), COORDINATOR_ID, f"{path}: coordinator.url", "address")
        _unique(seen_keys, coordinator.public_key, COORDINATOR_ID, f"{path}: coordinator.public_key", "public key")
    return RosterFile(path, nodes, coordinator)


def _endpoint(url: str) -> str:
    return parse_address(url).endpoint


def _unique(seen: dict[str, str], value: str, owner: str, field: str, what: str) -> None:
    if value in seen:
        raise ConfigError(field, f"the same {what} as {seen[value]!r} ({value[:20]}); every entry needs its own")
    seen[value] = owner


def entry_toml(node_id: str, info: PeerInfo) -> str:
    """One node's roster entry, as `p2pfl keygen` prints it for the roster's keeper."""
    doc = {"id": node_id, **info.to_dict()}
    return "[[node]]\n" + tomli_w.dumps(doc)


def write_roster(path: Path, nodes: Mapping[str, PeerInfo], coordinator: PeerInfo | None = None) -> None:
    doc: dict[str, Any] = {"node": [{"id": nid, **info.to_dict()} for nid, info in nodes.items()]}
    if coordinator is not None:
        doc["coordinator"] = coordinator.to_dict()
    header = ("# The nodes of one deployment, in index order (a node's position is its data slice).\n"
              "# The same file on every host; check it with `p2pfl roster check`.\n")
    path.write_text(header + tomli_w.dumps(doc))


@dataclass(frozen=True)
class Probe:
    id: str
    url: str
    reachable: bool
    seconds: float
    detail: str


async def _probe(node_id: str, url: str, timeout_s: float) -> Probe:
    address = parse_address(url)
    host, port = address.host, address.port_or_default
    started = time.perf_counter()
    try:
        _, writer = await wait_at_most(asyncio.open_connection(host, port), timeout_s)
    except asyncio.TimeoutError:
        return Probe(node_id, url, False, timeout_s, f"no answer within {timeout_s:g} s")
    except OSError as exc:
        return Probe(node_id, url, False, time.perf_counter() - started, exc.strerror or str(exc))
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass
    return Probe(node_id, url, True, time.perf_counter() - started, "accepts connections")


def probe_roster(roster: RosterFile, timeout_s: float, only: Sequence[str] | None = None) -> list[Probe]:
    """Open a TCP connection to every entry's address at once; each gets `timeout_s`."""
    targets = dict(roster.nodes)
    if roster.coordinator is not None:
        targets[COORDINATOR_ID] = roster.coordinator
    if only is not None:
        targets = {k: v for k, v in targets.items() if k in only}

    async def everything() -> list[Probe]:
        return list(await asyncio.gather(*(_probe(nid, info.url, timeout_s) for nid, info in targets.items())))

    return asyncio.run(everything())
