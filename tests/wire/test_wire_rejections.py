"""Every rejection class, triggered by a crafted frame, with its HTTP status and check order."""

from __future__ import annotations

import struct
from typing import Any

import blake3
import msgpack
import numpy as np
import pytest

from p2pfl.wire import (
    BadSignature,
    MalformedMessage,
    NodeKey,
    NonFiniteValues,
    OversizedMessage,
    ReplayedMessage,
    ReplayGuard,
    Roster,
    ShapeMismatch,
    StaleMessage,
    UnknownDtype,
    UnknownSender,
    WireError,
    WireLimits,
    WrongRecipient,
    encode,
    open_message,
    peek_header,
)

KEY = NodeKey.generate()
MALLORY = NodeKey.generate()
ROSTER = Roster({"alice": KEY.public_hex, "carol": NodeKey.generate().public_hex})
NOW = 1_800_000_000.0


def clock() -> float:
    return NOW


def guard() -> ReplayGuard:
    return ReplayGuard(clock=clock)


def raw_body(table: Any, data: bytes = b"") -> bytes:
    """A body from any table document: u32 length, msgpack table, padding, then `data` as given."""
    packed = msgpack.packb(table, use_bin_type=True)
    head = struct.pack("<I", len(packed)) + packed
    return head + bytes(-len(head) % 64) + data if data else head


def body_doc(tensors: dict[str, dict[str, Any]]) -> bytes:
    """A protocol-2 body laid out as the encoder does: each entry's `data` at the next multiple of 64."""
    table = [{"name": name, **{k: v for k, v in e.items() if k != "data"}} for name, e in tensors.items()]
    packed = msgpack.packb({"tensors": table}, use_bin_type=True)
    out = bytearray(struct.pack("<I", len(packed)) + packed)
    for e in tensors.values():
        data = e.get("data", b"")
        if data:
            out += bytes(-len(out) % 64) + data
    return bytes(out)


def entry(dtype: str = "float32", shape: list[int] | None = None, data: bytes | None = None) -> dict[str, Any]:
    shape = [2] if shape is None else shape
    if data is None:
        data = np.zeros(shape, dtype=dtype).tobytes()
    return {"dtype": dtype, "shape": shape, "data": data}


def header_doc(body: bytes, **over: Any) -> dict[str, Any]:
    doc = {
        "kind": "model", "sender": "alice", "recipient": "bob", "round": 1, "version": 1, "seq": 5,
        "timestamp": NOW, "part": "full", "meta": {}, "body_digest": blake3.blake3(body).digest(),
    }
    doc.update(over)
    return doc


def craft(body: bytes | None = None, *, key: NodeKey = KEY, header: Any = None, raw_header: bytes | None = None,
          magic: bytes = b"P2FL", protocol: int = 2, **over: Any) -> bytes:
    """Build a frame by hand, correctly signed by `key` unless told otherwise."""
    if body is None:
        body = body_doc({"w": entry()})
    if raw_header is None:
        raw_header = msgpack.packb(header if header is not None else header_doc(body, **over), use_bin_type=True)
    signed = magic + struct.pack(">BI", protocol, len(raw_header)) + raw_header
    start = signed + key.sign(signed)
    return start + bytes(-len(start) % 64) + body


def open_(frame: bytes, *, replay: ReplayGuard | None = None, **kw: Any):
    return open_message(frame, roster=ROSTER, recipient="bob", replay=replay if replay is not None else guard(), **kw)


def rejects(frame: bytes, cls: type[WireError], status: int, match: str | None = None, **kw: Any) -> WireError:
    with pytest.raises(cls, match=match) as exc:
        open_(frame, **kw)
    assert type(exc.value) is cls
    assert exc.value.status == status
    assert isinstance(exc.value.reason, str) and exc.value.reason
    return exc.value


def test_crafted_baseline_is_accepted() -> None:
    # Guards the helpers: every rejection below differs from this frame in one respect only.
    msg = open_(craft())
    assert msg.tensors["w"].tolist() == [0.0, 0.0]


# --- 413 --------------------------------------------------------------------------------

def test_oversized_garbage_is_413_not_400() -> None:
    limits = WireLimits(max_message_bytes=1000)
    rejects(b"\xff" * 1001, OversizedMessage, 413, "1001 bytes, limit is 1000", limits=limits)
    # Same garbage within the limit is a framing error: so size really is checked first.
    rejects(b"\xff" * 1000, MalformedMessage, 400, limits=limits)
    with pytest.raises(OversizedMessage):
        peek_header(b"\xff" * 1001, limits)


def test_oversized_genuine_message_is_413() -> None:
    frame = encode(key=KEY, kind="model", sender="alice", recipient="bob", round=0, version=0, seq=0, part="",
                   meta={}, tensors={"w": np.zeros(1000, np.float32)}, timestamp=NOW)
    rejects(frame, OversizedMessage, 413, limits=WireLimits(max_message_bytes=len(frame) - 1))
    open_(frame, limits=WireLimits(max_message_bytes=len(frame)))


# --- 400: framing and header -----------------------------------------------------------

@pytest.mark.parametrize(
    "frame, match",
    [
        (b"", "shorter than"),
        (b"P2FL\x02", "shorter than"),
        (b"XXXX" + bytes(100), "bad magic"),
        (craft(magic=b"P2FM"), "bad magic"),
        (craft(protocol=1), "protocol version 1 is not supported: this node speaks version 2"),
        (craft()[:80], "overruns"),
        (b"P2FL\x02" + struct.pack(">I", 2**31) + bytes(100), "header length"),
        (craft(raw_header=b"\xc1garbage"), "header is not valid msgpack"),
        (craft(raw_header=msgpack.packb([1, 2, 3])), "header must be a msgpack map"),
        (craft(raw_header=msgpack.packb({"kind": "model"})), "missing"),
        (craft(raw_header=msgpack.packb({**header_doc(body_doc({})), "extra": 1}, use_bin_type=True)), "unknown 'extra'"),
        (craft(round="1"), "'round' must be int"),
        (craft(seq=True), "'seq' must be int"),
        (craft(seq=-1), "'seq' must be >= 0"),
        (craft(sender=7), "'sender' must be str"),
        (craft(meta=[1]), "'meta' must be dict"),
        (craft(meta={"b": b"x"}), "non-JSON-like"),
        (craft(timestamp="now"), "'timestamp' must be"),
        (craft(timestamp=float("nan")), "must be finite"),
        (craft(body_digest=b"short"), "must be 32 bytes"),
        (craft(body_digest="00" * 32), "'body_digest' must be bytes"),
        (craft(raw_header=msgpack.packb(msgpack.ExtType(1, b"x"))), "extension type"),
    ],
    ids=["empty", "truncated-prefix", "bad-magic", "bad-magic-signed", "protocol", "truncated", "huge-header-len",
         "header-not-msgpack", "header-not-map", "missing-fields", "extra-field", "round-str", "seq-bool",
         "seq-negative", "sender-int", "meta-list", "meta-bytes", "timestamp-str", "timestamp-nan", "digest-short",
         "digest-str", "ext-type"],
)
def test_malformed_frame_or_header_is_400(frame: bytes, match: str) -> None:
    rejects(frame, MalformedMessage, 400, match)


def test_meta_over_limit_is_400() -> None:
    frame = craft(meta={"pad": "x" * 2000})
    rejects(frame, MalformedMessage, 400, r"meta is \d+ bytes, limit is 1000", limits=WireLimits(max_meta_bytes=1000))
    open_(frame)  # fine under the default limit


# --- 403 / 401 --------------------------------------------------------------------------

def test_wrong_recipient_is_403() -> None:
    rejects(craft(recipient="carol"), WrongRecipient, 403, "addressed to 'carol'")


def test_unknown_sender_is_403() -> None:
    rejects(craft(sender="mallory", key=MALLORY), UnknownSender, 403, "'mallory' is not in the roster")


def test_forged_signature_is_401() -> None:
    # Mallory claims to be alice, a roster member, but signs with her own key.
    rejects(craft(key=MALLORY), BadSignature, 401, "does not verify")


def test_signature_of_another_roster_member_is_401() -> None:
    # Carol's genuine key does not make a frame claiming to be alice valid.
    other = NodeKey.generate()
    roster = Roster({"alice": KEY.public_hex, "carol": other.public_hex})
    with pytest.raises(BadSignature):
        open_message(craft(key=other), roster=roster, recipient="bob", replay=guard())


def test_tampered_signature_is_401() -> None:
    frame = bytearray(craft())
    header_len = int.from_bytes(frame[5:9], "big")
    frame[9 + header_len + 3] ^= 0x01
    rejects(bytes(frame), BadSignature, 401)


def test_tampered_header_is_401() -> None:
    frame = craft(round=1)
    # Re-encode the header with another round, keep the original signature.
    header_len = int.from_bytes(frame[5:9], "big")
    header = msgpack.unpackb(frame[9 : 9 + header_len])
    header["round"] = 2
    new_header = msgpack.packb(header, use_bin_type=True)
    assert len(new_header) == header_len
    tampered = frame[:9] + new_header + frame[9 + header_len :]
    rejects(tampered, BadSignature, 401, "does not verify")


def test_tampered_body_is_401() -> None:
    frame = bytearray(craft(body_doc({"w": entry(data=np.array([1.0, 2.0], np.float32).tobytes())})))
    frame[-1] ^= 0x40  # flips a bit of the last float: still a well-formed body
    rejects(bytes(frame), BadSignature, 401, "body digest")


def test_appended_and_truncated_body_are_401() -> None:
    frame = craft()
    rejects(frame + b"\x00", BadSignature, 401, "body digest")
    rejects(frame[:-1], BadSignature, 401, "body digest")


# --- 400 / 415 / 422: body --------------------------------------------------------------

@pytest.mark.parametrize(
    "body, match",
    [
        (b"\xc1", "too short for its 4-byte table length"),
        (b"", "too short for its 4-byte table length"),
        (struct.pack("<I", 99) + b"\x80", "overruns the 5-byte body"),
        (struct.pack("<I", 1) + b"\xc1", "tensor table is not valid msgpack"),
        (raw_body([1]), "single key 'tensors'"),
        (raw_body({"tensors": [], "x": 1}), "single key 'tensors'"),
        (raw_body({"tensors": {}}), "'tensors' must be a list"),
        (raw_body({"tensors": [[1]]}), "must be a map with keys"),
        (raw_body({"tensors": [{"name": "w", "dtype": "float32"}]}), "must be a map with keys"),
        (body_doc({"w": {**entry(), "dtype": 5}}), "dtype must be a string"),
        (body_doc({"w": {**entry(), "shape": [-1]}}), "shape must be a list of ints"),
        (body_doc({"w": {**entry(), "shape": [True]}}), "shape must be a list of ints"),
        (body_doc({"w": {**entry(), "shape": 2}}), "shape must be a list of ints"),
        (raw_body({"tensors": [{"name": 3, "dtype": "float32", "shape": [2]}]}, bytes(8)), "name must be a string"),
        (body_doc({"w": entry(data=bytes(7))}), "'w' \\(float32 \\[2\\]\\) overruns"),
        (body_doc({"w": entry(shape=[2, 2], data=bytes(20))}), "4 bytes after the last tensor's data"),
        (body_doc({"w": entry(shape=[], data=b"")}), "'w' \\(float32 \\[\\]\\) overruns"),
        (body_doc({"w": entry(shape=[1] * 9)}), "9 dims, limit is 8"),
        (body_doc({f"t{i}": entry() for i in range(513)}), "513 tensors, limit is 512"),
        (raw_body({"tensors": [{"name": "w", "dtype": "float32", "shape": [2]}] * 2}, bytes(72)), "'w' appears twice"),
        (body_doc({"w": entry(shape=[2**63, 0], data=b"")}), "shape must be a list of ints in"),
    ],
    ids=["garbage", "empty", "table-overrun", "table-not-msgpack", "not-map", "extra-key", "tensors-map",
         "entry-list", "entry-missing-shape", "dtype-int", "negative-dim", "bool-dim", "shape-int", "name-int",
         "short-data", "long-data", "scalar-no-data", "too-many-dims", "too-many-tensors", "duplicate-name",
         "shape-overflow"],
)
def test_malformed_body_is_400(body: bytes, match: str) -> None:
    rejects(craft(body), MalformedMessage, 400, match)


def test_unknown_dtype_is_415() -> None:
    body = body_doc({"ok": entry(), "c": {"dtype": "complex64", "shape": [1], "data": bytes(8)}})
    rejects(craft(body), UnknownDtype, 415, "'c' has dtype 'complex64'")
    rejects(craft(body_doc({"o": {"dtype": "object", "shape": [1], "data": bytes(8)}})), UnknownDtype, 415)


def test_unknown_dtype_is_reported_before_data_length() -> None:
    body = body_doc({"c": {"dtype": "bfloat16", "shape": [4], "data": bytes(3)}})
    rejects(craft(body), UnknownDtype, 415)


def test_shape_mismatch_is_422() -> None:
    frame = craft(body_doc({"body.fc.weight": entry(shape=[10, 3]), "b": entry()}))
    exp = {"body.fc.weight": ((10, 4), "float32"), "b": ((2,), "float32")}
    err = rejects(frame, ShapeMismatch, 422, expected=exp)
    assert str(err) == "tensor 'body.fc.weight' has shape (10, 3), expected (10, 4)"


def test_dtype_mismatch_vs_expected_is_422() -> None:
    frame = craft(body_doc({"w": entry(dtype="float64")}))
    rejects(frame, ShapeMismatch, 422, "'w' has dtype float64, expected float32", expected={"w": ((2,), "float32")})


def test_missing_and_extra_names_vs_expected_are_422() -> None:
    frame = craft(body_doc({"a": entry(), "extra": entry()}))
    exp = {"a": ((2,), "float32"), "gone": ((2,), "float32")}
    err = rejects(frame, ShapeMismatch, 422, expected=exp)
    assert "missing tensors 'gone'" in str(err) and "unexpected tensors 'extra'" in str(err)
    rejects(craft(body_doc({"a": entry()})), ShapeMismatch, 422, "missing tensors 'gone'", expected=exp)
    rejects(craft(body_doc({"a": entry(), "gone": entry(), "x": entry()})), ShapeMismatch, 422,
            "unexpected tensors 'x'", expected=exp)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
def test_non_finite_floats_are_422(dtype: str, bad: float) -> None:
    data = np.array([[1.0, 2.0], [bad, 3.0]], dtype=dtype)
    frame = craft(body_doc({"fine": entry(), "w": entry(dtype, [2, 2], data.tobytes())}))
    rejects(frame, NonFiniteValues, 422, "tensor 'w' has")


def test_integer_tensors_are_not_finite_checked() -> None:
    # 0xFF.. patterns would be NaN as floats; as ints they are ordinary values.
    data = np.full(4, -1, np.int32).tobytes()
    assert open_(craft(body_doc({"i": entry("int32", [4], data)}))).tensors["i"].tolist() == [-1] * 4


# --- order of checks ---------------------------------------------------------------------

def test_checks_run_cheapest_first() -> None:
    # wrong recipient + forged -> 403 recipient (before signature)
    rejects(craft(recipient="carol", key=MALLORY), WrongRecipient, 403)
    # forged + garbage body -> 401 (the body is never parsed for an unauthenticated sender)
    rejects(craft(b"\xc1garbage", key=MALLORY), BadSignature, 401)
    # forged + replayed seq -> 401 (the replay state is not consulted before authentication)
    g = guard()
    open_(craft(seq=9), replay=g)
    rejects(craft(seq=9, key=MALLORY), BadSignature, 401, replay=g)
    # replayed + malformed body -> 409 (replay check happens before body parsing)
    rejects(craft(b"\xc1", seq=9), ReplayedMessage, 409, replay=g)
    # stale + unknown dtype -> 409
    rejects(craft(body_doc({"c": entry("complex64", [1], bytes(8))}), timestamp=NOW - 10_000), StaleMessage, 409)
    # shape mismatch + NaN -> 422 shape mismatch
    nan = np.array([np.nan, 1], np.float32).tobytes()
    rejects(craft(body_doc({"w": entry(data=nan)})), ShapeMismatch, 422, expected={"w": ((3,), "float32")})


def test_peek_header_does_not_verify() -> None:
    frame = craft(key=MALLORY, seq=77)
    assert peek_header(frame).seq == 77
    with pytest.raises(MalformedMessage):
        peek_header(b"P2FL\x02" + bytes(100))


def test_error_messages_truncate_hostile_names() -> None:
    err = rejects(craft(sender="m" * 10_000), UnknownSender, 403)
    assert len(str(err)) < 200


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("size", [1, 7, 65_535, 65_536, 65_537, 200_003])
def test_all_finite_agrees_with_isfinite_anywhere_in_large_tensors(dtype: str, size: int) -> None:
    from p2pfl.wire.body import all_finite

    rng = np.random.default_rng(size)
    base = rng.uniform(-1, 1, size).astype(dtype) * np.finfo(dtype).max  # huge but finite values
    assert all_finite(base)
    for position in {0, size // 2, size - 1, max(size - 65_536, 0)}:
        for bad in (np.nan, np.inf, -np.inf):
            arr = base.copy()
            arr[position] = bad
            assert all_finite(arr) == bool(np.isfinite(arr).all()) is False, (position, bad)
