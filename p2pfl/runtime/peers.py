"""Who a node can talk to: a peer's address and keys as configs and rosters name them, and the
coordinator's fixed id. A leaf: the node config, the roster file and the strategy contract all
import it, and it imports none of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from p2pfl.errors import ConfigError
from p2pfl.runtime.transport.addresses import address_format_of, known_shapes

COORDINATOR_ID = "coordinator"  # the optional coordinator's id, in rosters, configs and messages


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



def parse_peer(value: Any, where: str) -> PeerInfo:
    if not isinstance(value, Mapping):
        raise ConfigError(where, "expected a table with `url` and `public_key`")
    for key in value:
        if key not in ("url", "public_key", "tls_fingerprint"):
            raise ConfigError(f"{where}.{key}", "unknown field; allowed: url, public_key, tls_fingerprint")
    url, pub = value.get("url"), value.get("public_key")
    fmt = address_format_of(url)
    if fmt is None:
        raise ConfigError(f"{where}.url", f"expected a carrier's address ({known_shapes()}), got {url!r}")
    try:
        address = fmt.parse(url)
    except ValueError as exc:
        raise ConfigError(f"{where}.url", f"{url!r}: {exc}") from None
    if not address.host or any(c in address.netloc for c in " <>") or address.port == 0:
        raise ConfigError(f"{where}.url", f"expected {fmt.shape} with a real host, got {url!r}")
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
