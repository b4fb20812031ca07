"""Where a peer is reached, as the carriers write it: `http(s)://host:port` (HTTP and its TLS;
loopback and colocated name their in-memory endpoints by the same host:port). Every reader of an
address outside the carriers (the roster, node configs, a federation's records and seeds) parses
it here, so that a carrier with an address format of its own changes one module."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeGuard
from urllib.parse import urlsplit

SCHEMES = ("http://", "https://")


@dataclass(frozen=True)
class Address:
    scheme: str
    host: str          # "" where the address names none
    port: int | None   # None where it names none
    netloc: str

    @property
    def port_or_default(self) -> int:
        return self.port or (443 if self.scheme == "https" else 80)

    @property
    def endpoint(self) -> str:
        """host:port, the scheme's default port where it names none."""
        return f"{self.host}:{self.port_or_default}"


def parse_address(url: str) -> Address:
    """The parts of `url`; ValueError where it is not a URL (a port out of range, a bad bracket)."""
    parts = urlsplit(url)
    return Address(parts.scheme, parts.hostname or "", parts.port, parts.netloc)


def is_http(url: object) -> TypeGuard[str]:
    """An http:// or https:// address (the carriers' one scheme family)."""
    return isinstance(url, str) and url.startswith(SCHEMES)


def host_of(authority: str) -> str:
    """The host an HTTP `Host` header (host[:port]) names; "" where it names none."""
    try:
        return urlsplit(f"//{authority}").hostname or ""
    except ValueError:
        return ""
