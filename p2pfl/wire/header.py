"""Signed message header: routing, ordering and freshness fields plus the body digest."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack

from p2pfl.wire.errors import MalformedMessage, quote

# 2: BLAKE3 body digest, raw tensor bytes after a msgpack tensor table, 64-byte aligned body.
PROTOCOL_VERSION: int = 2
_DIGEST_BYTES = 32
_MAX_META_DEPTH = 32


@dataclass(frozen=True)
class Header:
    kind: str
    sender: str
    recipient: str
    round: int
    version: int
    seq: int
    timestamp: float
    part: str
    meta: dict[str, Any]
    body_digest: bytes
    protocol: int = PROTOCOL_VERSION


# Field name -> accepted Python types after msgpack decoding. bool is excluded from the
# int fields explicitly below, since isinstance(True, int) holds.
_FIELDS: dict[str, tuple[type, ...]] = {
    "kind": (str,),
    "sender": (str,),
    "recipient": (str,),
    "round": (int,),
    "version": (int,),
    "seq": (int,),
    "timestamp": (float, int),
    "part": (str,),
    "meta": (dict,),
    "body_digest": (bytes,),
}
_FIELD_NAMES = frozenset(_FIELDS)


def is_json_like(value: Any, depth: int = 0) -> bool:
    """True for None/bool/int/float/str and lists/maps (str keys) of those: what JSON can carry."""
    if depth > _MAX_META_DEPTH:
        return False
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(is_json_like(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_json_like(v, depth + 1) for k, v in value.items())
    return False


def pack_header(
    *,
    kind: str,
    sender: str,
    recipient: str,
    round: int,
    version: int,
    seq: int,
    timestamp: float,
    part: str,
    meta: Mapping[str, Any],
    body_digest: bytes,
) -> bytes:
    meta_dict = dict(meta)
    # Fail on the sender, where the bug is, rather than as a 400 at every receiver.
    if not is_json_like(meta_dict):
        raise TypeError(f"meta must hold only JSON-like values (None/bool/int/float/str/list/dict[str]): {meta_dict!r}")
    for name, value in (("kind", kind), ("sender", sender), ("recipient", recipient), ("part", part)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    for name, value in (("round", round), ("version", version), ("seq", seq)):
        if type(value) is not int:
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if seq < 0:
        raise ValueError(f"seq must be >= 0, got {seq}")
    return msgpack.packb(
        {
            "kind": kind,
            "sender": sender,
            "recipient": recipient,
            "round": round,
            "version": version,
            "seq": seq,
            "timestamp": float(timestamp),
            "part": part,
            "meta": meta_dict,
            "body_digest": body_digest,
        },
        use_bin_type=True,
    )


def validate_header(doc: Any, protocol: int, max_meta_bytes: int) -> Header:
    """Turn a decoded header map into a Header, rejecting anything missing, extra or mistyped."""
    if not isinstance(doc, dict):
        raise MalformedMessage(f"header must be a msgpack map, got {type(doc).__name__}")
    keys = set(doc)
    if keys != _FIELD_NAMES:
        parts = []
        if _FIELD_NAMES - keys:
            parts.append(f"missing {', '.join(sorted(_FIELD_NAMES - keys))}")
        if keys - _FIELD_NAMES:
            parts.append(f"unknown {', '.join(quote(k) for k in sorted(keys - _FIELD_NAMES, key=str))}")
        raise MalformedMessage(f"header fields: {'; '.join(parts)}")
    for name, types in _FIELDS.items():
        value = doc[name]
        if isinstance(value, bool) or not isinstance(value, types):
            raise MalformedMessage(f"header field {name!r} must be {'/'.join(t.__name__ for t in types)}, got {type(value).__name__}")
    if doc["seq"] < 0:
        raise MalformedMessage(f"header field 'seq' must be >= 0, got {doc['seq']}")
    timestamp = float(doc["timestamp"])
    if not math.isfinite(timestamp):
        raise MalformedMessage(f"header field 'timestamp' must be finite, got {timestamp}")
    if len(doc["body_digest"]) != _DIGEST_BYTES:
        raise MalformedMessage(f"header field 'body_digest' must be {_DIGEST_BYTES} bytes, got {len(doc['body_digest'])}")
    meta = doc["meta"]
    if not is_json_like(meta):
        raise MalformedMessage("header field 'meta' holds non-JSON-like values")
    # Re-packing is bounded by the header length cap already enforced by the framing.
    meta_len = len(msgpack.packb(meta, use_bin_type=True))
    if meta_len > max_meta_bytes:
        raise MalformedMessage(f"header meta is {meta_len} bytes, limit is {max_meta_bytes}")
    return Header(
        kind=doc["kind"],
        sender=doc["sender"],
        recipient=doc["recipient"],
        round=doc["round"],
        version=doc["version"],
        seq=doc["seq"],
        timestamp=timestamp,
        part=doc["part"],
        meta=meta,
        body_digest=doc["body_digest"],
        protocol=protocol,
    )
