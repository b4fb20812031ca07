"""Where a peer is reached: each carrier kind's address format, and the readers of addresses.

A carrier kind owns its format (`AddressFormat`: the schemes it reads, how it writes a host and
port, with TLS or without): HTTP and colocated write `http(s)://host:port`, loopback names its
in-memory endpoints `loopback://host:port`. A kind declares its format where it is registered
(`p2pfl.runtime.transport.CARRIERS`); every reader of an address outside the carriers (the
roster, node configs, the launcher, a federation's records and seeds) asks this module, so a
carrier with an address format of its own changes no other module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TypeGuard
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Address:
    scheme: str
    host: str          # "" where the address names none
    port: int | None   # None where it names none
    netloc: str
    default_port: int | None = None

    @property
    def port_or_default(self) -> int:
        port = self.port or self.default_port
        if port is None:
            raise ValueError(f"{self.scheme}://{self.netloc} names no port and its scheme has no default")
        return port

    @property
    def endpoint(self) -> str:
        """host:port, the scheme's default port where it names none."""
        return f"{self.host}:{self.port_or_default}"


@dataclass(frozen=True)
class AddressFormat:
    """How one carrier kind writes and reads where its nodes are reached."""

    schemes: tuple[str, ...]            # read; the first is written without TLS
    tls_scheme: str | None = None       # written with TLS (None: the carrier has no TLS)
    default_ports: Mapping[str, int] = field(default_factory=dict)

    @property
    def shape(self) -> str:
        """What an address looks like, for error messages ("http(s)://host:port")."""
        if self.tls_scheme is not None and self.tls_scheme.startswith(self.schemes[0]):
            return f"{self.schemes[0]}({self.tls_scheme.removeprefix(self.schemes[0])})://host:port"
        return f"{'|'.join(self.schemes)}://host:port"

    def scheme(self, tls: bool = False) -> str:
        if not tls:
            return self.schemes[0]
        if self.tls_scheme is None:
            raise ValueError(f"{self.shape} addresses have no TLS form")
        return self.tls_scheme

    def format(self, host: str, port: int | str, *, tls: bool = False) -> str:
        return f"{self.scheme(tls)}://{host}:{port}"

    def reads(self, url: object) -> TypeGuard[str]:
        return isinstance(url, str) and url.partition("://")[0] in self.schemes and "://" in url

    def parse(self, url: str) -> Address:
        """The parts of `url`; ValueError where this format does not read it or it is not a URL
        (a port out of range, a bad bracket)."""
        if not self.reads(url):
            raise ValueError(f"expected {self.shape}, got {url!r}")
        parts = urlsplit(url)
        return Address(parts.scheme, parts.hostname or "", parts.port, parts.netloc,
                       self.default_ports.get(parts.scheme))


HTTP = AddressFormat(("http", "https"), tls_scheme="https", default_ports={"http": 80, "https": 443})
LOOPBACK = AddressFormat(("loopback",))

_FORMATS: list[AddressFormat] = [HTTP, LOOPBACK]


def register_address_format(fmt: AddressFormat) -> None:
    """Let readers of addresses take `fmt`'s (a carrier kind registered with a format of its own)."""
    if fmt not in _FORMATS:
        _FORMATS.append(fmt)


def address_format_of(url: object) -> AddressFormat | None:
    """The registered format that reads `url`; None where no carrier kind does."""
    return next((fmt for fmt in _FORMATS if fmt.reads(url)), None)


def known_shapes() -> str:
    return ", ".join(fmt.shape for fmt in _FORMATS)


def parse_address(url: str) -> Address:
    """The parts of `url`, read by the carrier kind whose format it is; ValueError where none reads it."""
    fmt = address_format_of(url)
    if fmt is None:
        raise ValueError(f"{url!r} is no carrier's address (expected one of {known_shapes()})")
    return fmt.parse(url)


def host_of(authority: str) -> str:
    """The host an HTTP `Host` header (host[:port]) names; "" where it names none."""
    try:
        return urlsplit(f"//{authority}").hostname or ""
    except ValueError:
        return ""
