"""A member record: what a member says of itself (its id, where it is reached, its key and its
certificate), signed by its own key and timestamped, so that any member can pass it on and any
receiver can check it without asking the member. The newest record of a member wins (a new
address after a restart); an older one is ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from p2pfl.runtime.federation.certificates import (MALFORMED, Certificate, Refused, Revocations, _member_id, _time, check,
                                                   signature_holds)
from p2pfl.runtime.transport.addresses import HTTP
from p2pfl.wire import NodeKey
from p2pfl.wire.errors import quote

RECORD_TAG = b"p2pfl-member-v1"
RECORD_FIELDS = ("member", "url", "certificate", "at", "signature", "tls_fingerprint")
MAX_URL_CHARS = 200


@dataclass(frozen=True)
class MemberRecord:
    member: str
    url: str | None           # None: outbound only (it reaches out; nobody can reach it)
    certificate: Certificate
    at: float                 # when the member signed it
    signature: str            # by the member's key (the certificate's), hex
    tls_fingerprint: str | None = None  # SHA-256 of its TLS certificate (runtime.tls): what others pin

    @property
    def public_key(self) -> str:
        return self.certificate.public_key

    def signed_bytes(self) -> bytes:
        return msgpack.packb([RECORD_TAG, self.member, self.url, self.certificate.signed_bytes(), self.at,
                              self.tls_fingerprint], use_bin_type=True)

    def to_dict(self) -> dict[str, Any]:
        return {"member": self.member, "url": self.url, "certificate": self.certificate.to_dict(), "at": self.at,
                "signature": self.signature, "tls_fingerprint": self.tls_fingerprint}

    @classmethod
    def from_dict(cls, raw: Any) -> MemberRecord:
        if not isinstance(raw, Mapping) or set(raw) != set(RECORD_FIELDS):
            raise Refused(MALFORMED, f"a member record has exactly {', '.join(RECORD_FIELDS)}")
        fingerprint = raw["tls_fingerprint"]
        if fingerprint is not None and not (isinstance(fingerprint, str) and len(fingerprint) == 64
                                            and all(c in "0123456789abcdef" for c in fingerprint)):
            raise Refused(MALFORMED, "tls_fingerprint: expected 64 lowercase hex characters or none")
        url = raw["url"]
        if url is not None:
            _check_url(url)
        if not isinstance(raw["signature"], str):
            raise Refused(MALFORMED, "record signature: expected hex")
        return cls(_member_id(raw["member"]), url, Certificate.from_dict(raw["certificate"]), _time(raw["at"], "at"),
                   raw["signature"], fingerprint)


def _check_url(url: Any) -> None:
    # A federation's members reach each other over HTTP (its gossip and its carriers).
    if not HTTP.reads(url) or len(url) > MAX_URL_CHARS:
        raise Refused(MALFORMED, f"url: expected an http(s) URL of at most {MAX_URL_CHARS} characters, got {quote(url)}")
    try:
        address = HTTP.parse(url)
    except ValueError:
        raise Refused(MALFORMED, f"url: {quote(url)} is not a URL") from None
    if not address.host or not address.port:
        raise Refused(MALFORMED, f"url: expected http(s)://host:port, got {quote(url)}")


def sign_record(key: NodeKey, certificate: Certificate, url: str | None, *, now: float,
                tls_fingerprint: str | None = None) -> MemberRecord:
    if certificate.public_key != key.public_hex:
        raise ValueError(f"the certificate is for key {certificate.public_key[:16]}..., this node's key is "
                         f"{key.public_hex[:16]}...: wrong certificate or wrong key file")
    if url is not None:
        _check_url(url)
    unsigned = MemberRecord(certificate.member, url, certificate, float(now), "", tls_fingerprint)
    return MemberRecord(unsigned.member, url, certificate, unsigned.at, key.sign(unsigned.signed_bytes()).hex(),
                        tls_fingerprint)


def check_record(record: MemberRecord, federation_public: str, *, now: float, revocations: Revocations | None) -> None:
    """Refused unless the record's certificate admits it now and the record is signed by the key the
    certificate names, for the member the certificate names."""
    check(record.certificate, federation_public, now=now, revocations=revocations)
    if record.member != record.certificate.member:
        raise Refused(MALFORMED, f"record of {quote(record.member)} carries {quote(record.certificate.member)}'s certificate")
    if not signature_holds(record.public_key, record.signature, record.signed_bytes()):
        raise Refused(MALFORMED, f"{quote(record.member)}'s record is not signed by the key its certificate names")
