"""Signed, pickle-free wire format for p2pfl messages.

Depends on nothing else in p2pfl, so the transport, the runtime and offline tools can
all use it without import cycles.
"""

from p2pfl.wire.body import DTYPES, EncodedBody, encode_body
from p2pfl.wire.envelope import (
    MAGIC,
    PREFIX_BYTES,
    Frame,
    Message,
    authenticate_head,
    encode,
    head_length,
    open_message,
    peek_header,
    seal,
    seal_frame,
)
from p2pfl.wire.errors import (
    BadSignature,
    MalformedMessage,
    NonFiniteValues,
    OversizedMessage,
    ReplayedMessage,
    ShapeMismatch,
    StaleMessage,
    UnknownDtype,
    UnknownSender,
    WireError,
    WrongRecipient,
)
from p2pfl.wire.header import PROTOCOL_VERSION, Header
from p2pfl.wire.keys import NodeKey, NotAMember, Roster, roster_key
from p2pfl.wire.limits import WireLimits
from p2pfl.wire.replay import ReplayGuard

__all__ = [
    "BadSignature",
    "DTYPES",
    "EncodedBody",
    "Frame",
    "Header",
    "MAGIC",
    "PREFIX_BYTES",
    "MalformedMessage",
    "Message",
    "NodeKey",
    "NotAMember",
    "NonFiniteValues",
    "OversizedMessage",
    "PROTOCOL_VERSION",
    "ReplayGuard",
    "ReplayedMessage",
    "Roster",
    "ShapeMismatch",
    "StaleMessage",
    "UnknownDtype",
    "UnknownSender",
    "WireError",
    "WireLimits",
    "WrongRecipient",
    "authenticate_head",
    "encode",
    "encode_body",
    "head_length",
    "open_message",
    "roster_key",
    "peek_header",
    "seal",
    "seal_frame",
]
