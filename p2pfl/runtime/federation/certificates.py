"""Admission by certificate: the federation's operator signs who is a member, and who no longer is.

A federation key (Ed25519, kept on the operator's host) signs two kinds of statement:

* a **certificate**: "the key K belongs to member M, from time I until time E (or for good)";
* a **revocation list**: "members M1, M2... are out, each from time T" (a whole list, numbered by
  the time it was signed, so the newest supersedes every older one as it spreads).

A certificate for M issued before M's revocation time is revoked; one issued after it (the member
re-admitted, with a new key) is not. Everything here is pure: bytes in, a verdict out. No clocks
are read (callers pass `now`), nothing is sent.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import nacl.bindings
import nacl.exceptions
import tomli_w

from p2pfl.wire import NodeKey
from p2pfl.wire.errors import quote

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CERTIFICATE_TAG = b"p2pfl-certificate-v1"
REVOCATIONS_TAG = b"p2pfl-revocations-v1"
MAX_ID_CHARS = 128

# Why a member, or what it sent, is refused: the causes a node's log and results name.
UNKNOWN = "certificate_unknown"        # no certificate, or not one this federation could have signed
EXPIRED = "certificate_expired"
REVOKED = "certificate_revoked"
WRONG_FEDERATION = "wrong_federation"  # signed by another federation's key
MALFORMED = "certificate_malformed"
CAUSES = (UNKNOWN, EXPIRED, REVOKED, WRONG_FEDERATION, MALFORMED)


class Refused(Exception):
    """A member (or a statement about members) this federation does not admit; `cause` is one of CAUSES."""

    def __init__(self, cause: str, detail: str) -> None:
        super().__init__(f"{cause}: {detail}")
        self.cause, self.detail = cause, detail


def _hex_key(value: Any, what: str) -> str:
    if not isinstance(value, str) or len(value) != 64:
        raise Refused(MALFORMED, f"{what}: expected 64 hex characters")
    try:
        bytes.fromhex(value)
    except ValueError:
        raise Refused(MALFORMED, f"{what}: not valid hex") from None
    return value.lower()


def _member_id(value: Any, what: str = "member") -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_ID_CHARS or not value.isprintable():
        raise Refused(MALFORMED, f"{what}: expected a printable id of 1 to {MAX_ID_CHARS} characters, got {quote(value)}")
    return value


def _time(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise Refused(MALFORMED, f"{what}: expected a time in seconds since the epoch, got {quote(value)}")
    return float(value)


def signature_holds(public_hex: str, signature_hex: str, data: bytes) -> bool:
    """Whether `signature_hex` (as a certificate, list or record carries it) signs `data` under the key."""
    try:
        nacl.bindings.crypto_sign_open(bytes.fromhex(signature_hex) + data, bytes.fromhex(public_hex))
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError, ValueError, TypeError):
        return False
    return True


@dataclass(frozen=True)
class Certificate:
    federation: str            # the federation's public key (hex)
    member: str                # the member's id
    public_key: str            # the member's public key (hex)
    issued: float
    expires: float | None      # None: until revoked
    signature: str             # by the federation key, hex

    def signed_bytes(self) -> bytes:
        return msgpack.packb([CERTIFICATE_TAG, self.federation, self.member, self.public_key, self.issued,
                              self.expires], use_bin_type=True)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"federation": self.federation, "member": self.member, "public_key": self.public_key,
                               "issued": self.issued, "signature": self.signature}
        if self.expires is not None:
            out["expires"] = self.expires
        return out

    @classmethod
    def from_dict(cls, raw: Any) -> Certificate:
        """A certificate's fields, checked for form (not for its signature: `check` does that)."""
        if not isinstance(raw, Mapping):
            raise Refused(UNKNOWN, "no certificate (expected a table with federation, member, public_key, issued, signature)")
        extra = set(raw) - {"federation", "member", "public_key", "issued", "expires", "signature"}
        if extra:
            raise Refused(MALFORMED, f"unknown certificate fields {sorted(map(str, extra))[:5]}")
        signature = raw.get("signature")
        if not isinstance(signature, str) or len(signature) != 128:
            raise Refused(MALFORMED, "signature: expected 128 hex characters")
        expires = raw.get("expires")
        return cls(federation=_hex_key(raw.get("federation"), "federation"), member=_member_id(raw.get("member")),
                   public_key=_hex_key(raw.get("public_key"), "public_key"), issued=_time(raw.get("issued"), "issued"),
                   expires=None if expires is None else _time(expires, "expires"), signature=signature.lower())

    def save(self, path: Path) -> None:
        path.write_text("# A p2pfl membership certificate (`p2pfl federation admit`): public, not a secret.\n"
                        + tomli_w.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: Path) -> Certificate:
        try:
            return cls.from_dict(tomllib.loads(Path(path).read_text()))
        except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise Refused(UNKNOWN, f"{path}: cannot be read ({exc})") from None


def issue(federation: NodeKey, member: str, public_key: str, *, now: float, expires: float | None = None) -> Certificate:
    """The federation's certificate for `member`'s key."""
    unsigned = Certificate(federation.public_hex, _member_id(member), _hex_key(public_key, "public_key"), float(now),
                           None if expires is None else float(expires), "0" * 128)
    if expires is not None and expires <= now:
        raise ValueError(f"the certificate would expire at {expires}, before it is issued ({now})")
    return Certificate(**{**unsigned.__dict__, "signature": federation.sign(unsigned.signed_bytes()).hex()})


@dataclass(frozen=True)
class Revocations:
    """The federation's newest list of members out, each with the time from which it is out."""

    federation: str
    number: int                                  # when it was signed (ns): a larger one supersedes
    revoked: Mapping[str, float] = field(default_factory=dict)
    signature: str = ""

    def signed_bytes(self) -> bytes:
        return msgpack.packb([REVOCATIONS_TAG, self.federation, self.number, sorted(self.revoked.items())],
                             use_bin_type=True)

    def to_dict(self) -> dict[str, Any]:
        return {"federation": self.federation, "number": self.number, "revoked": dict(self.revoked),
                "signature": self.signature}

    @classmethod
    def from_dict(cls, raw: Any) -> Revocations:
        if not isinstance(raw, Mapping) or set(raw) != {"federation", "number", "revoked", "signature"}:
            raise Refused(MALFORMED, "a revocation list has exactly federation, number, revoked and signature")
        number, revoked = raw["number"], raw["revoked"]
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            raise Refused(MALFORMED, f"revocation number: expected a non-negative integer, got {quote(number)}")
        if not isinstance(revoked, Mapping):
            raise Refused(MALFORMED, "revoked: expected a table of member -> time")
        if not isinstance(raw["signature"], str):
            raise Refused(MALFORMED, "revocation signature: expected hex")
        return cls(_hex_key(raw["federation"], "federation"), number,
                   {_member_id(m): _time(t, f"revoked.{quote(m)}") for m, t in revoked.items()}, raw["signature"])

    def out_from(self, member: str) -> float | None:
        return self.revoked.get(member)


def empty_revocations(federation_public: str) -> Revocations:
    """What a node knows before it hears of any revocation (number 0: any signed list supersedes it)."""
    return Revocations(federation_public, 0, {}, "")


def revoke(federation: NodeKey, current: Revocations | None, member: str, *, now: float) -> Revocations:
    """`current` with `member` out from `now`, signed anew."""
    revoked = dict(current.revoked) if current is not None else {}
    revoked[_member_id(member)] = float(now)
    number = max(int(now * 1e9), (current.number + 1) if current is not None else 0)
    unsigned = Revocations(federation.public_hex, number, revoked, "")
    return Revocations(federation.public_hex, number, revoked, federation.sign(unsigned.signed_bytes()).hex())


def check_revocations(revocations: Revocations, federation_public: str) -> None:
    """A revocation list signed by this federation's key (Refused otherwise)."""
    if revocations.federation != federation_public:
        raise Refused(WRONG_FEDERATION, f"revocation list of federation {revocations.federation[:16]}..., "
                                        f"not {federation_public[:16]}...")
    if not signature_holds(federation_public, revocations.signature, revocations.signed_bytes()):
        raise Refused(MALFORMED, "the revocation list's signature does not verify under the federation key")


def check(certificate: Certificate, federation_public: str, *, now: float, revocations: Revocations | None) -> None:
    """Refused (naming the cause) unless `certificate` is this federation's, in force at `now`, and
    not revoked by `revocations` (which the caller has checked)."""
    if certificate.federation != federation_public:
        raise Refused(WRONG_FEDERATION, f"{quote(certificate.member)}'s certificate names federation "
                                        f"{certificate.federation[:16]}..., this one is {federation_public[:16]}...")
    if not signature_holds(federation_public, certificate.signature, certificate.signed_bytes()):
        raise Refused(UNKNOWN, f"{quote(certificate.member)}'s certificate is not signed by this federation's key")
    if certificate.expires is not None and now >= certificate.expires:
        raise Refused(EXPIRED, f"{quote(certificate.member)}'s certificate expired {now - certificate.expires:.0f} s ago")
    out_from = revocations.out_from(certificate.member) if revocations is not None else None
    if out_from is not None and certificate.issued <= out_from:
        raise Refused(REVOKED, f"{quote(certificate.member)} was revoked by the federation")
