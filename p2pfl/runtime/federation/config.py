"""The `[federation]` table of a node's config: how a host joins a federation without a roster.

    id = "alpha"
    key_file = "alpha.key"
    scenario = "scenario.toml"
    port = 9001

    [federation]
    public_key = "federation.pub"             # the federation's public key: a file, or its 64 hex
    certificate = "alpha.cert"                # `p2pfl federation admit` made it for this node's key
    seeds = ["http://192.0.2.10:9000"]        # one to three members' addresses (this node's own: it is the first)
    url = "http://192.0.2.11:9001"            # where the others reach this node; none: outbound only (behind NAT)
    # gossip_s = 2.0                          # between two exchanges with members drawn at random
    # seed_wait_s = 30.0                      # how long the seeds are tried before the node gives up
    # revocations = "alpha.revocations.toml"  # where this member keeps the newest revocation list it has
    #                                         # heard (read at start: a restarted seed refuses the revoked);
    #                                         # an operator may put its own list there. Default: beside the certificate
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from p2pfl.errors import ConfigError
from p2pfl.runtime.federation.certificates import Certificate, Refused, check
from p2pfl.runtime.transport.addresses import HTTP

FIELDS = ("public_key", "certificate", "seeds", "url", "gossip_s", "seed_wait_s", "revocations")
MAX_SEEDS = 3


@dataclass(frozen=True)
class FederationConfig:
    public_key: str                  # the federation's (hex)
    certificate: Path
    seeds: tuple[str, ...]
    url: str | None                  # None: nobody can reach this node; it pushes its parts
    gossip_s: float = 2.0
    seed_wait_s: float = 30.0
    revocations: Path | None = None  # the newest revocation list, kept on disk (None: beside the certificate)

    @property
    def revocations_file(self) -> Path:
        return self.revocations or self.certificate.with_name(self.certificate.stem + ".revocations.toml")

    def to_dict(self) -> dict[str, Any]:
        out = {"public_key": self.public_key, "certificate": str(self.certificate), "seeds": list(self.seeds),
               "gossip_s": self.gossip_s, "seed_wait_s": self.seed_wait_s, "revocations": str(self.revocations_file)}
        return out if self.url is None else {**out, "url": self.url}


def read_public_key(value: str, base: Path, where: str) -> str:
    """A public key given as its 64 hex characters, or as a file that holds them."""
    text = value.strip()
    if len(text) != 64 or any(c not in "0123456789abcdefABCDEF" for c in text):
        path = Path(text) if Path(text).is_absolute() else base / text
        if not path.is_file():
            raise ConfigError(where, f"expected the federation's public key (64 hex characters) or a file holding it; "
                                     f"{path} does not exist")
        text = path.read_text().split("#")[0].strip()
        if len(text) != 64:
            raise ConfigError(where, f"{path} does not hold a public key (64 hex characters)")
    try:
        bytes.fromhex(text)
    except ValueError:
        raise ConfigError(where, "not valid hex") from None
    return text.lower()


def _url(value: Any, where: str) -> str:
    if not HTTP.reads(value):  # a federation's members reach each other over HTTP
        raise ConfigError(where, f"expected an {HTTP.shape} address, got {value!r}")
    try:
        address = HTTP.parse(value)
    except ValueError as exc:
        raise ConfigError(where, f"{value!r}: {exc}") from None
    if not address.host or not address.port:
        raise ConfigError(where, f"expected http(s)://host:port, got {value!r}")
    return value.rstrip("/")


def parse_federation(raw: Any, base: Path, node_id: str, node_public: str) -> FederationConfig:
    """The table, checked: the certificate is this federation's, for this id and this key, in force."""
    if not isinstance(raw, Mapping):
        raise ConfigError("federation", f"expected a table with {', '.join(FIELDS[:4])}")
    for key in raw:
        if key not in FIELDS:
            raise ConfigError(f"federation.{key}", f"unknown field; allowed: {', '.join(FIELDS)}")
    for key in ("public_key", "certificate", "seeds"):
        if key not in raw:
            raise ConfigError(f"federation.{key}", "missing")
    if not isinstance(raw["public_key"], str) or not isinstance(raw["certificate"], str):
        raise ConfigError("federation", "public_key and certificate are strings (hex, or file names)")
    public = read_public_key(raw["public_key"], base, "federation.public_key")
    seeds = raw["seeds"]
    if not isinstance(seeds, list) or not 1 <= len(seeds) <= MAX_SEEDS:
        raise ConfigError("federation.seeds", f"expected 1 to {MAX_SEEDS} members' addresses, got {seeds!r}")
    seeds = tuple(_url(s, f"federation.seeds[{i}]") for i, s in enumerate(seeds))
    url = _url(raw["url"], "federation.url") if "url" in raw else None
    numbers = {}
    for key, default in (("gossip_s", 2.0), ("seed_wait_s", 30.0)):
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"federation.{key}", f"expected a positive number of seconds, got {value!r}")
        numbers[key] = float(value)
    path = Path(raw["certificate"])
    path = path if path.is_absolute() else base / path
    if not path.is_file():
        raise ConfigError("federation.certificate", f"{path} not found (the operator makes it: p2pfl federation admit "
                                                    f"<this node's .pub> --id {node_id})")
    try:
        certificate = Certificate.load(path)
        check(certificate, public, now=time.time(), revocations=None)
    except Refused as refused:
        raise ConfigError("federation.certificate", f"{path}: {refused}") from None
    if certificate.member != node_id:
        raise ConfigError("federation.certificate", f"{path} admits {certificate.member!r}, this node is {node_id!r}")
    if certificate.public_key != node_public:
        raise ConfigError("federation.certificate", f"{path} admits key {certificate.public_key[:16]}..., this node's "
                                                    f"key file holds {node_public[:16]}...: wrong certificate or key file")
    revocations = raw.get("revocations")
    if revocations is not None and (not isinstance(revocations, str) or not revocations):
        raise ConfigError("federation.revocations", f"expected a file name, got {revocations!r}")
    kept = None if revocations is None else (Path(revocations) if Path(revocations).is_absolute() else base / revocations)
    return FederationConfig(public, path, seeds, url, numbers["gossip_s"], numbers["seed_wait_s"], kept)
