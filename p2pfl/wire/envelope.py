"""Framing, sealing and opening of signed messages.

Frame layout (protocol 2):
    MAGIC b"P2FL" | u8 protocol | u32 header_len (BE) | header msgpack | 64-byte Ed25519 signature
    | zero padding to a multiple of 64 bytes | body

The signature covers everything before it; the header carries the body's BLAKE3 digest, so
the body is covered without signing megabytes, and a body encoded once can be sealed per
recipient for the cost of one small msgpack, one signature and no copy of the body: a
sealed frame is a list of buffers (`Frame`) that the transport writes as they are.
"""

from __future__ import annotations

import struct
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from p2pfl.wire.body import (
    EncodedBody,
    TensorLike,
    check_expected,
    check_finite,
    decode_body,
    digest,
    encode_body,
    padding,
    unpack_strict,
)
from p2pfl.wire.errors import BadSignature, MalformedMessage, OversizedMessage, WrongRecipient, quote
from p2pfl.wire.header import PROTOCOL_VERSION, Header, pack_header, validate_header
from p2pfl.wire.keys import SIGNATURE_BYTES, NodeKey, Roster
from p2pfl.wire.limits import HEADER_OVERHEAD_BYTES, WireLimits
from p2pfl.wire.replay import ReplayGuard

if TYPE_CHECKING:
    import torch

MAGIC = b"P2FL"
_PREFIX = struct.Struct(">4sBI")
PREFIX_BYTES = _PREFIX.size  # 9
_DEFAULT_LIMITS = WireLimits()


@dataclass(frozen=True)
class Frame:
    """A sealed message as buffers: signed prefix and header, signature, padding, then the body's chunks."""

    chunks: tuple[bytes | memoryview, ...]
    nbytes: int
    param_bytes: int

    def tobytes(self) -> bytes:
        return b"".join(self.chunks)


def body_offset(header_len: int) -> int:
    """Where the body starts in a frame whose header is `header_len` bytes (a multiple of ALIGN)."""
    end = PREFIX_BYTES + header_len + SIGNATURE_BYTES
    return end + padding(end)


def seal_frame(
    *,
    key: NodeKey,
    kind: str,
    sender: str,
    recipient: str,
    round: int,
    version: int,
    seq: int,
    part: str,
    meta: Mapping[str, Any],
    body: EncodedBody,
    timestamp: float | None = None,
) -> Frame:
    header = pack_header(
        kind=kind,
        sender=sender,
        recipient=recipient,
        round=round,
        version=version,
        seq=seq,
        timestamp=time.time() if timestamp is None else timestamp,
        part=part,
        meta=meta,
        body_digest=body.digest,
    )
    signed = _PREFIX.pack(MAGIC, PROTOCOL_VERSION, len(header)) + header
    start = b"".join((signed, key.sign(signed), bytes(padding(len(signed) + SIGNATURE_BYTES))))
    return Frame(chunks=(start, *body.chunks), nbytes=len(start) + body.nbytes, param_bytes=body.param_bytes)


def seal(**fields: Any) -> bytes:
    """`seal_frame` joined into one bytes object (takes the same keyword arguments)."""
    return seal_frame(**fields).tobytes()


def encode(
    *,
    key: NodeKey,
    kind: str,
    sender: str,
    recipient: str,
    round: int,
    version: int,
    seq: int,
    part: str,
    meta: Mapping[str, Any],
    tensors: Mapping[str, TensorLike],
    timestamp: float | None = None,
) -> bytes:
    return seal(
        key=key,
        kind=kind,
        sender=sender,
        recipient=recipient,
        round=round,
        version=version,
        seq=seq,
        part=part,
        meta=meta,
        body=encode_body(tensors),
        timestamp=timestamp,
    )


@dataclass
class Message:
    header: Header
    tensors: dict[str, np.ndarray]
    total_bytes: int
    param_bytes: int

    @property
    def meta_bytes(self) -> int:
        return self.total_bytes - self.param_bytes

    def torch_tensors(self) -> dict[str, torch.Tensor]:
        import torch

        global _READ_ONLY_WARNING_PASSED
        # The arrays are read-only views of immutable bytes; torch warns because it cannot
        # mark tensors read-only. Callers must copy before writing in place (load_state_dict copies).
        # Torch gives that warning once per process (unless told to warn always): only the first
        # call needs it kept quiet. `catch_warnings` copies and restores the process's warning
        # filters, at every call: thousands of frames a round in a worker of many nodes.
        if _READ_ONLY_WARNING_PASSED and not torch.is_warn_always_enabled():
            return {name: torch.from_numpy(arr) for name, arr in self.tensors.items()}
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*not writable.*", category=UserWarning)
            tensors = {name: torch.from_numpy(arr) for name, arr in self.tensors.items()}
        _READ_ONLY_WARNING_PASSED = any(not arr.flags.writeable for arr in self.tensors.values())
        return tensors


_READ_ONLY_WARNING_PASSED = False  # torch.from_numpy has met a read-only array (and warned, quietly)


def _as_byte_view(data: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(data)
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    return view


def _check_prefix(view: memoryview, total: int, limits: WireLimits) -> int:
    """Size, magic, protocol and header length of a `total`-byte message; returns the header length."""
    if total > limits.max_message_bytes:
        raise OversizedMessage(f"message is {total} bytes, limit is {limits.max_message_bytes}")
    if total < PREFIX_BYTES + SIGNATURE_BYTES or view.nbytes < PREFIX_BYTES:
        raise MalformedMessage(f"message is {total} bytes, shorter than the {PREFIX_BYTES + SIGNATURE_BYTES}-byte minimum frame")
    magic, protocol, header_len = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise MalformedMessage(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if protocol != PROTOCOL_VERSION:
        raise MalformedMessage(f"protocol version {protocol} is not supported: this node speaks version {PROTOCOL_VERSION}")
    max_header = limits.max_meta_bytes + HEADER_OVERHEAD_BYTES
    if header_len > max_header:
        raise MalformedMessage(f"header length {header_len} exceeds the limit of {max_header} bytes")
    if body_offset(header_len) > total:
        raise MalformedMessage(
            f"header length {header_len} plus signature and padding overruns the {total}-byte message"
        )
    return header_len


def head_length(prefix: bytes | memoryview, total: int, limits: WireLimits = _DEFAULT_LIMITS) -> int:
    """From the first PREFIX_BYTES of a `total`-byte message: how many bytes precede the body
    (prefix, header, signature, padding). Lets a receiver authenticate the head before it
    reads, and buffers, the body."""
    return body_offset(_check_prefix(_as_byte_view(prefix), total, limits))


def _parse_frame(view: memoryview, limits: WireLimits, total: int | None = None) -> tuple[Header, int]:
    """Check size and framing and decode the header, unauthenticated. Returns (header, signed_len)."""
    header_len = _check_prefix(view, view.nbytes if total is None else total, limits)
    signed_len = PREFIX_BYTES + header_len
    try:
        doc = unpack_strict(view[PREFIX_BYTES:signed_len])
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise MalformedMessage(f"header is not valid msgpack: {exc}") from None
    return validate_header(doc, PROTOCOL_VERSION, limits.max_meta_bytes), signed_len


def _authenticate(view: memoryview, header: Header, signed_len: int, roster: Roster, recipient: str) -> None:
    if header.recipient != recipient:
        raise WrongRecipient(f"message is addressed to {quote(header.recipient)}, this node is {quote(recipient)}")
    roster.verify(header.sender, bytes(view[signed_len : signed_len + SIGNATURE_BYTES]), view[:signed_len])
    # The padding to the body is outside the signature: only zeros are accepted, so a relay
    # cannot make one signed frame into many different byte strings.
    pad = view[signed_len + SIGNATURE_BYTES : body_offset(signed_len - PREFIX_BYTES)]
    if any(pad.tobytes()):
        raise MalformedMessage("padding between the signature and the body is not all zero")


def peek_header(data: bytes | bytearray | memoryview, limits: WireLimits = _DEFAULT_LIMITS) -> Header:
    """Decode the header WITHOUT verifying anything: for logging and routing decisions only."""
    header, _ = _parse_frame(_as_byte_view(data), limits)
    return header


def authenticate_head(
    head: bytes | memoryview, *, total: int, roster: Roster, recipient: str, limits: WireLimits = _DEFAULT_LIMITS
) -> Header:
    """The header of a `total`-byte message from its head alone (see `head_length`), signature
    verified: the receiver knows who sent it before it reads the body."""
    view = _as_byte_view(head)
    header, signed_len = _parse_frame(view, limits, total)
    if view.nbytes != body_offset(signed_len - PREFIX_BYTES):
        raise MalformedMessage(f"head is {view.nbytes} bytes, expected {body_offset(signed_len - PREFIX_BYTES)}")
    _authenticate(view, header, signed_len, roster, recipient)
    return header


def open_message(
    data: bytes | bytearray | memoryview,
    *,
    roster: Roster,
    recipient: str,
    replay: ReplayGuard | None,
    limits: WireLimits = _DEFAULT_LIMITS,
    expected: Mapping[str, tuple[tuple[int, ...], str]] | None = None,
    body: bytes | memoryview | None = None,
) -> Message:
    """Authenticate and decode a frame; raises a WireError subclass naming the first problem found.

    `data` is the whole frame, or only its head when the body was read separately (`body`).
    Checks run cheapest first, and nothing an unauthenticated sender controls reaches the
    replay state or the body parser: replay.check comes after the signature and digest,
    replay.record after every other check passed.
    """
    view = _as_byte_view(data)
    total = view.nbytes + (0 if body is None else memoryview(body).nbytes)
    header, signed_len = _parse_frame(view, limits, total)
    start = body_offset(signed_len - PREFIX_BYTES)
    if body is not None and view.nbytes != start:
        raise MalformedMessage(f"head is {view.nbytes} bytes, expected {start}")
    _authenticate(view, header, signed_len, roster, recipient)
    body_view = view[start:] if body is None else _as_byte_view(body)
    if digest([body_view]) != header.body_digest:
        raise BadSignature(f"body digest does not match the signed header ({body_view.nbytes} body bytes)")
    if replay is not None:
        replay.check(header.sender, header.seq, header.timestamp)
    arrays, param_bytes = decode_body(body_view, limits)
    if expected is not None:
        check_expected(arrays, expected)
    check_finite(arrays)
    if replay is not None:
        replay.record(header.sender, header.seq)
    return Message(header=header, tensors=arrays, total_bytes=total, param_bytes=param_bytes)
