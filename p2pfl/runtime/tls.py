"""Optional TLS between nodes (`runtime.tls = true`), with no certificate authority.

Each node's certificate is self-signed with its own Ed25519 key and built from fixed fields
(subject = node id, serial 1, validity 2000-01-01 to 9999-12-31). Ed25519 signatures are
deterministic, so the certificate, and its SHA-256 fingerprint, is a function of the key:
the launcher that made the keys writes each peer's fingerprint into the roster, and a
client pins it (`aiohttp.Fingerprint`) before it sends a single byte of its request.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import ssl
import tempfile

import aiohttp
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import NameOID

from p2pfl.wire import NodeKey

_NOT_BEFORE = datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc)
_NOT_AFTER = datetime.datetime(9999, 12, 31, tzinfo=datetime.timezone.utc)


def _private(key: NodeKey) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(key.private_hex()))


def certificate(key: NodeKey, node_id: str) -> x509.Certificate:
    private = _private(key)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)])
    return (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(private.public_key()).serial_number(1)
        .not_valid_before(_NOT_BEFORE).not_valid_after(_NOT_AFTER)
        .sign(private, None)
    )


def fingerprint(key: NodeKey, node_id: str) -> str:
    """SHA-256 of the node's certificate (DER), hex: what peers pin."""
    return hashlib.sha256(certificate(key, node_id).public_bytes(serialization.Encoding.DER)).hexdigest()


def server_context(key: NodeKey, node_id: str) -> ssl.SSLContext:
    """TLS 1.3 server context presenting the node's own certificate."""
    pem = certificate(key, node_id).public_bytes(serialization.Encoding.PEM) + _private(key).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    # ssl loads certificates from files only: a private temporary file, removed at once.
    fd, path = tempfile.mkstemp(prefix=f".{node_id}.", suffix=".pem")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
        context.load_cert_chain(path)
    finally:
        os.unlink(path)
    return context


def pin(fingerprint_hex: str) -> aiohttp.Fingerprint:
    return aiohttp.Fingerprint(bytes.fromhex(fingerprint_hex))
