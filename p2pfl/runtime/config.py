"""A node's own config (TOML): who it is, where it listens, its key, the scenario, and its peers.

Peers come from a roster file shared by every host (`roster = "roster.toml"`, see
`p2pfl.runtime.roster` and `nodes/example.toml`), or inline as `[peers.<id>]` tables, as the
launcher writes them for runs on one machine. Both name the node's key file, which must be
readable by its owner only.
"""

from __future__ import annotations

import functools
import json
import os
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomli_w

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from p2pfl.errors import ConfigError
from p2pfl.runtime.peers import COORDINATOR_ID, PeerInfo, parse_peer
from p2pfl.runtime.shared_tables import Overlay
from p2pfl.runtime.transport.addresses import parse_address

if TYPE_CHECKING:
    from p2pfl.runtime.federation.config import FederationConfig

NODE_FIELDS = {"id", "index", "host", "port", "key_file", "scenario", "out", "overrides", "peers", "coordinator", "roster",
               "federation"}


def node_ids(n: int) -> list[str]:
    """The ids of a run's n nodes, zero-padded so that they sort in index order."""
    width = len(str(n - 1))
    return [f"node-{i:0{width}d}" for i in range(n)]


@functools.lru_cache(maxsize=4)
def node_id_table(n: int) -> tuple[str, ...]:
    """`node_ids(n)`, made once a process: each of a worker's thousands of nodes looks its peers up in it."""
    return tuple(node_ids(n))


@dataclass(frozen=True)
class NodeConfig:
    id: str
    index: int
    host: str
    port: int
    key_file: Path
    scenario: Path
    out: Path
    peers: Mapping[str, PeerInfo]
    coordinator: PeerInfo | None = None
    overrides: tuple[str, ...] = field(default_factory=tuple)
    # Where `peers`, `index` and `port` come from when they were read from a shared roster file:
    # saved as that reference, so that a run's N configs do not each repeat its N entries.
    roster: Path | None = None
    # A federation's member (`p2pfl.runtime.federation`): no roster, no peers; they are found from seeds.
    federation: FederationConfig | None = None

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "id": self.id, "host": self.host,
            "key_file": str(self.key_file), "scenario": str(self.scenario), "out": str(self.out),
            "overrides": list(self.overrides),
        }
        if self.roster is not None:
            doc["roster"] = str(self.roster)
            return doc
        if self.federation is not None:
            doc.update(port=self.port, federation=self.federation.to_dict())
            return doc
        doc.update(index=self.index, port=self.port, peers={pid: p.to_dict() for pid, p in self.peers.items()})
        if self.coordinator is not None:  # TOML has no null: absent means none
            doc["coordinator"] = self.coordinator.to_dict()
        return doc

    def save(self, path: Path, resolved_folder: str | None = None) -> None:
        """Written with its files named relative to the config's own folder (as `load_node_config`
        reads them), so that a run folder copied elsewhere resumes in the copy, not the original.
        `resolved_folder`: that folder resolved, by a caller that writes many configs into it."""
        doc = self.to_dict()
        base = resolved_folder or str(path.parent.resolve())
        for key in ("key_file", "scenario", "out", "roster"):
            if key in doc and os.path.isabs(doc[key]):
                doc[key] = os.path.relpath(doc[key], base)
        if "federation" in doc and os.path.isabs(doc["federation"]["certificate"]):
            doc["federation"]["certificate"] = os.path.relpath(doc["federation"]["certificate"], base)
        path.write_text(tomli_w.dumps(doc))


def load_node_config(path: str | Path) -> NodeConfig:
    """A node (or coordinator) config, validated: every problem is a ConfigError naming the field
    or file. With a roster, the node's index, listening port (default: its roster URL's) and
    peers come from it, and its key must be the one the roster lists."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("config", f"file not found: {path}")
    try:
        raw = json.loads(path.read_text()) if path.suffix == ".json" else tomllib.loads(path.read_text())
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError("config", f"{path} cannot be parsed: {exc}") from exc
    for key in raw:
        if key not in NODE_FIELDS:
            raise ConfigError(key, f"unknown field in {path}; allowed fields are {sorted(NODE_FIELDS)}")
    with_roster, with_federation = "roster" in raw, "federation" in raw
    if with_roster and ("peers" in raw or "coordinator" in raw):
        raise ConfigError("roster", f"{path} names a roster and lists peers too; keep one of them")
    if with_federation and ("roster" in raw or "peers" in raw or "coordinator" in raw or "index" in raw):
        raise ConfigError("federation", f"{path}: a federation's member finds its peers from its seeds; "
                                        "drop roster, peers, coordinator and index")
    # An outbound-only member (no [federation] url) is reached by nobody: any free port will do.
    needed = () if with_federation else () if with_roster else ("index", "port", "peers")
    for key in ("id", "key_file", "scenario") + needed:
        if key not in raw:
            raise ConfigError(key, f"missing in {path}" + ("" if with_roster or key != "peers" else
                                                           " (or name a shared roster file: roster = \"roster.toml\")"))
    if not isinstance(raw["id"], str) or not raw["id"]:
        raise ConfigError("id", "expected a non-empty string")
    for key in ("index", "port"):
        if key in raw and (not isinstance(raw[key], int) or isinstance(raw[key], bool) or raw[key] < 0):
            raise ConfigError(key, f"expected a non-negative integer, got {raw[key]!r}")
    base = path.parent

    def resolve(p: str) -> Path:
        q = Path(p)
        return q if q.is_absolute() else Path(os.path.normpath(base / q))  # "nodes/../keys" as "keys"

    key_file = resolve(raw["key_file"])
    roster = resolve(raw["roster"]) if with_roster else None
    federation = None
    if with_federation:
        check_key_file(key_file)
        federation = _federation(raw, base, key_file)
        if "port" not in raw and federation.url is not None:
            raise ConfigError("port", f"missing in {path}: where this node listens (its federation url names "
                                      f"{federation.url})")
        index, port, peers, coordinator = 0, raw.get("port", 0), {}, None
    elif roster is not None:
        check_key_file(key_file)
        index, port, peers, coordinator = _from_roster(raw, roster, key_file)
    else:
        if not isinstance(raw["peers"], Mapping):
            raise ConfigError("peers", "expected a table of peer id -> {url, public_key}")
        index, port = raw["index"], raw["port"]
        peers = {pid: parse_peer(info, f"peers.{pid}") for pid, info in raw["peers"].items() if pid != raw["id"]}
        coordinator = None if raw.get("coordinator") is None else parse_peer(raw["coordinator"], "coordinator")
        check_key_file(key_file)
    overrides = raw.get("overrides", [])
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError("overrides", "expected a list of 'key.path=value' strings")
    return NodeConfig(
        id=raw["id"], index=index, host=str(raw.get("host", "0.0.0.0")), port=port,
        key_file=key_file, scenario=resolve(raw["scenario"]), out=resolve(raw.get("out", "runs/node")),
        peers=peers, coordinator=coordinator, overrides=tuple(overrides), roster=roster, federation=federation,
    )


def _federation(raw: Mapping[str, Any], base: Path, key_file: Path) -> FederationConfig:
    from p2pfl.runtime.federation.config import parse_federation
    from p2pfl.wire import NodeKey

    try:
        public = NodeKey.load(key_file).public_hex
    except ValueError as exc:
        raise ConfigError("key_file", str(exc)) from None
    return parse_federation(raw["federation"], base, raw["id"], public)


def check_key_file(path: Path) -> None:
    """A private key file exists and only its owner can read it (as ssh insists)."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        raise ConfigError("key_file", f"{path} not found (make one with: p2pfl keygen <id> --out {path.parent})") from None
    if mode & 0o077:
        raise ConfigError("key_file", f"{path} can be read by others (mode {mode:o}); run: chmod 600 {path}")


def _from_roster(raw: Mapping[str, Any], roster_path: Path, key_file: Path
                 ) -> tuple[int, int, Mapping[str, PeerInfo], PeerInfo | None]:
    """(index, port, peers, coordinator) of `raw["id"]` from the roster, after checking that
    the key file holds the private half of the roster's public key for it."""
    from p2pfl.runtime.roster import load_roster
    from p2pfl.wire import NodeKey

    roster = load_roster(roster_path)  # read once per process: a worker's nodes share one roster
    node_id = raw["id"]
    entry = roster.entry(node_id)
    try:
        public = NodeKey.load(key_file).public_hex
    except ValueError as exc:
        raise ConfigError("key_file", str(exc)) from None
    if public != entry.public_key:
        raise ConfigError("key_file", f"{key_file} holds the key of {public[:16]}..., but {roster_path} lists "
                                      f"{entry.public_key[:16]}... for {node_id}: wrong key file, or a stale roster")
    # Views of the roster's one table (p2pfl.runtime.shared_tables): the nodes a worker hosts
    # share it instead of holding N entries each.
    if node_id == COORDINATOR_ID:
        index, peers, coordinator = 0, Overlay(roster.nodes), None
    else:
        index, coordinator = roster.index(node_id), roster.coordinator
        peers = Overlay(roster.nodes, removed=(node_id,))
    if "index" in raw and raw["index"] != index:
        raise ConfigError("index", f"{raw['index']} disagrees with {roster_path}, where {node_id} is entry {index}; "
                                   "drop `index` (the roster's order decides)")
    port = raw.get("port", parse_address(entry.url).port)
    if port is None:
        raise ConfigError("port", f"missing, and {node_id}'s roster URL {entry.url} names no port")
    return index, port, peers, coordinator
