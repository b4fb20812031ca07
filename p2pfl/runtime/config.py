"""A node's own config: who it is, where it listens, its key, and its peers.

The launcher writes one per node (JSON) for local runs; for a LAN deployment a person
writes one TOML per machine (see `nodes/example.toml`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from p2pfl.errors import ConfigError

NODE_FIELDS = {"id", "index", "host", "port", "key_file", "scenario", "out", "overrides", "peers", "coordinator"}


def node_ids(n: int) -> list[str]:
    """The ids of a run's n nodes, zero-padded so that they sort in index order."""
    width = len(str(n - 1))
    return [f"node-{i:0{width}d}" for i in range(n)]


@dataclass(frozen=True)
class PeerInfo:
    url: str
    public_key: str
    tls_fingerprint: str | None = None  # SHA-256 of the peer's certificate, pinned when runtime.tls is on

    def to_dict(self) -> dict[str, str]:
        out = {"url": self.url, "public_key": self.public_key}
        if self.tls_fingerprint is not None:
            out["tls_fingerprint"] = self.tls_fingerprint
        return out


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "index": self.index, "host": self.host, "port": self.port,
            "key_file": str(self.key_file), "scenario": str(self.scenario), "out": str(self.out),
            "overrides": list(self.overrides),
            "peers": {pid: p.to_dict() for pid, p in self.peers.items()},
            "coordinator": None if self.coordinator is None else self.coordinator.to_dict(),
        }

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=2))


def _peer(value: Any, where: str) -> PeerInfo:
    if not isinstance(value, Mapping):
        raise ConfigError(where, "expected a table with `url` and `public_key`")
    for key in value:
        if key not in ("url", "public_key", "tls_fingerprint"):
            raise ConfigError(f"{where}.{key}", "unknown field; allowed: url, public_key, tls_fingerprint")
    url, pub = value.get("url"), value.get("public_key")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError(f"{where}.url", f"expected an http(s) URL, got {url!r}")
    if not isinstance(pub, str) or len(pub) != 64:
        raise ConfigError(f"{where}.public_key", "expected the peer's Ed25519 public key as 64 hex characters")
    try:
        bytes.fromhex(pub)
    except ValueError:
        raise ConfigError(f"{where}.public_key", "not valid hex") from None
    fp = value.get("tls_fingerprint")
    if fp is not None:
        try:
            ok = isinstance(fp, str) and len(bytes.fromhex(fp)) == 32
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(f"{where}.tls_fingerprint", "expected the SHA-256 of the peer's certificate as 64 hex characters")
    return PeerInfo(url.rstrip("/"), pub, fp)


def load_node_config(path: str | Path) -> NodeConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError("config", f"file not found: {path}")
    try:
        raw = json.loads(path.read_text()) if path.suffix == ".json" else tomllib.loads(path.read_text())
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError("config", f"{path} cannot be parsed: {exc}") from exc
    for key in raw:
        if key not in NODE_FIELDS:
            raise ConfigError(key, f"unknown field; allowed fields are {sorted(NODE_FIELDS)}")
    for key in ("id", "index", "port", "key_file", "scenario", "peers"):
        if key not in raw:
            raise ConfigError(key, "missing")
    if not isinstance(raw["id"], str) or not raw["id"]:
        raise ConfigError("id", "expected a non-empty string")
    for key in ("index", "port"):
        if not isinstance(raw[key], int) or isinstance(raw[key], bool) or raw[key] < 0:
            raise ConfigError(key, f"expected a non-negative integer, got {raw[key]!r}")
    if not isinstance(raw["peers"], Mapping):
        raise ConfigError("peers", "expected a table of peer id -> {url, public_key}")
    base = path.parent

    def resolve(p: str) -> Path:
        q = Path(p)
        return q if q.is_absolute() else (base / q)

    peers = {pid: _peer(info, f"peers.{pid}") for pid, info in raw["peers"].items() if pid != raw["id"]}
    coordinator = None if raw.get("coordinator") is None else _peer(raw["coordinator"], "coordinator")
    overrides = raw.get("overrides", [])
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise ConfigError("overrides", "expected a list of 'key.path=value' strings")
    return NodeConfig(
        id=raw["id"], index=raw["index"], host=str(raw.get("host", "0.0.0.0")), port=raw["port"],
        key_file=resolve(raw["key_file"]), scenario=resolve(raw["scenario"]), out=resolve(raw.get("out", "runs/node")),
        peers=peers, coordinator=coordinator, overrides=tuple(overrides),
    )
