"""Signed read requests: who asks a node for a part, proven with the asker's roster key.

A GET of a part carries `AUTH_HEADER: <hex msgpack [requester, target, part, min_version,
timestamp, seq]>.<hex Ed25519 signature>`. The target checks the signature against its
roster, that the request names itself and the part and version asked for in the URL, and
the sender's replay window (the seq comes from the same counter as the requester's frames,
so one window serves both). Without it a node's model could be read by anyone who can
reach it, and one peer's answer relayed to another.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import msgpack

from p2pfl.wire.body import unpack_strict
from p2pfl.wire.errors import BadSignature, MalformedMessage, WrongRecipient, quote
from p2pfl.wire.keys import SIGNATURE_BYTES, NodeKey, Roster
from p2pfl.wire.replay import ReplayGuard

AUTH_HEADER = "X-P2PFL-Auth"
_MAX_TOKEN_CHARS = 2048


@dataclass(frozen=True)
class ReadRequest:
    requester: str
    target: str
    part: str
    min_version: int
    timestamp: float
    seq: int


def sign_request(key: NodeKey, request: ReadRequest) -> str:
    payload = msgpack.packb(
        [request.requester, request.target, request.part, request.min_version, float(request.timestamp), request.seq],
        use_bin_type=True,
    )
    return f"{payload.hex()}.{key.sign(payload).hex()}"


def request_for(key: NodeKey, requester: str, target: str, part: str, min_version: int, seq: int) -> str:
    return sign_request(key, ReadRequest(requester, target, part, min_version, time.time(), seq))


def verify_request(token: str | None, *, roster: Roster, target: str, part: str, min_version: int,
                   replay: ReplayGuard) -> ReadRequest:
    """The verified request, or a WireError: 401 missing or bad signature, 403 unknown requester
    or another target, 400 malformed or not matching the URL, 409 replayed or stale."""
    if not token:
        raise BadSignature(f"missing {AUTH_HEADER}: reads must be signed by a roster member")
    if len(token) > _MAX_TOKEN_CHARS or token.count(".") != 1:
        raise MalformedMessage(f"{AUTH_HEADER} must be '<hex payload>.<hex signature>' of at most {_MAX_TOKEN_CHARS} characters")
    payload_hex, signature_hex = token.split(".")
    try:
        payload, signature = bytes.fromhex(payload_hex), bytes.fromhex(signature_hex)
        doc = unpack_strict(payload)
    except Exception as exc:  # hex and msgpack raise several unrelated types
        raise MalformedMessage(f"{AUTH_HEADER} cannot be decoded: {quote(str(exc), 120)}") from None
    if (not isinstance(doc, list) or len(doc) != 6 or not all(isinstance(v, str) for v in doc[:3])
            or any(type(v) is not int for v in (doc[3], doc[5])) or type(doc[4]) not in (int, float)):
        raise MalformedMessage(f"{AUTH_HEADER} payload must be [requester, target, part, min_version, timestamp, seq]")
    request = ReadRequest(doc[0], doc[1], doc[2], doc[3], float(doc[4]), doc[5])
    roster.require(request.requester)
    if len(signature) != SIGNATURE_BYTES:
        raise BadSignature(f"signature is {len(signature)} bytes, expected {SIGNATURE_BYTES}")
    roster.verify(request.requester, signature, payload)
    if request.target != target:
        raise WrongRecipient(f"request is for {quote(request.target)}, this node is {quote(target)}")
    if request.part != part or request.min_version != min_version:
        raise MalformedMessage(
            f"signed request is for {quote(request.part)} version {request.min_version}, the URL asks for "
            f"{quote(part)} version {min_version}"
        )
    if request.seq < 0 or not math.isfinite(request.timestamp):
        raise MalformedMessage("signed request seq must be >= 0 and its timestamp finite")
    replay.check(request.requester, request.seq, request.timestamp)
    replay.record(request.requester, request.seq)
    return request
