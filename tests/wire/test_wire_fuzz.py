"""Whatever a roster peer signs, `open_message` answers with a WireError or a message, never
another exception (issue 30, finding 1: a zero dim beside huge dims escaped as ValueError)."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2pfl.wire import MalformedMessage, WireError, WireLimits
from p2pfl.wire.body import DTYPES
from tests.wire.test_wire_rejections import KEY, craft, open_

LIMIT = WireLimits().max_message_bytes


def signed_body(table: Any, data: bytes) -> bytes:
    """A frame a roster peer signed around any tensor table and any data bytes."""
    packed = msgpack.packb(table, use_bin_type=True)
    head = struct.pack("<I", len(packed)) + packed
    return craft(head + bytes(-len(head) % 64) + data, key=KEY)


def fitting_data(table: dict[str, Any], rng: np.random.Generator) -> bytes | None:
    """Random data laid out exactly as `table` says (so decoding gets past the length checks to
    the arrays themselves), or None where the table names no size that small."""
    offset = 4 + len(msgpack.packb(table, use_bin_type=True))
    offset += -offset % 64
    start = offset
    for entry in table["tensors"]:
        dtype = np.dtype(entry["dtype"]) if entry["dtype"] in DTYPES else None
        if dtype is None or any(d < 0 for d in entry["shape"]):
            return None
        offset += -offset % 64
        offset += int(np.prod(entry["shape"], dtype=object)) * dtype.itemsize
        if offset - start > 4096:
            return None
    return rng.bytes(offset - start)


def opens_or_wire_error(frame: bytes) -> None:
    try:
        open_(frame)
    except WireError:
        pass


@pytest.mark.parametrize("shape", [[LIMIT, LIMIT, LIMIT, 0], [0, LIMIT, LIMIT, LIMIT], [2**20, 0, 2**20],
                                   [LIMIT, 0, 2]])
def test_a_zero_dim_beside_huge_dims_is_a_wire_error(shape: list[int]) -> None:
    """Review finding 1."""
    frame = signed_body({"tensors": [{"name": "w", "dtype": "float32", "shape": shape}]}, b"")
    with pytest.raises(MalformedMessage, match="multiplies past"):
        open_(frame)


def test_a_zero_sized_tensor_of_modest_dims_still_opens() -> None:
    frame = signed_body({"tensors": [{"name": "w", "dtype": "float32", "shape": [0, 3, 5]}]}, b"")
    assert open_(frame).tensors["w"].shape == (0, 3, 5)


def test_padding_after_the_signature_must_be_zero() -> None:
    """Review finding 13: The padding is outside the signature: a relay flipping it made one signed frame many."""
    for size in range(64):  # a header length that leaves room for padding
        frame = bytearray(craft(meta={"p": "x" * size}))
        pad_start = 9 + struct.unpack(">I", frame[5:9])[0] + 64
        if pad_start % 64:
            break
    open_(bytes(frame))
    frame[pad_start] = 1
    with pytest.raises(MalformedMessage, match="padding between the signature and the body"):
        open_(bytes(frame))


msgpack_ints = st.integers(-2**63, 2**64 - 1)  # what msgpack can encode at all
dims = st.one_of(st.integers(0, 4), st.sampled_from([0, 1, 2**31, 2**32, LIMIT, LIMIT + 1]), st.integers(-3, 2**40), msgpack_ints)
entries = st.fixed_dictionaries({
    "name": st.one_of(st.text(max_size=4), msgpack_ints, st.none()),
    "dtype": st.one_of(st.sampled_from(sorted(DTYPES)), st.text(max_size=6), msgpack_ints),
    "shape": st.one_of(st.lists(dims, max_size=6), msgpack_ints, st.text(max_size=3)),
}, optional={"extra": msgpack_ints})
tables = st.one_of(st.fixed_dictionaries({"tensors": st.lists(entries, max_size=4)}),
                   st.dictionaries(st.text(max_size=8), msgpack_ints, max_size=2), st.lists(msgpack_ints, max_size=3))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(table=tables, data=st.binary(max_size=300))
def test_any_signed_tensor_table_opens_or_raises_a_wire_error(table: Any, data: bytes) -> None:
    opens_or_wire_error(signed_body(table, data))


def _random_table(rng: np.random.Generator) -> dict[str, Any]:
    special = [0, 1, 2, 7, 64, 2**16, 2**31 - 1, 2**31, 2**32, 2**63 - 1, LIMIT, LIMIT + 1, -1]
    entries_ = []
    for i in range(int(rng.integers(0, 4))):
        ndim = int(rng.integers(0, 10))
        shape = [int(rng.choice(special)) if rng.random() < 0.5 else int(rng.integers(0, 6)) for _ in range(ndim)]
        if shape and rng.random() < 0.2:  # at-limit dims beside a zero: finding 1's shape
            shape = [LIMIT] * len(shape)
            shape[int(rng.integers(0, len(shape)))] = 0
        dtype = str(rng.choice(sorted(DTYPES) + ["float128", "object", ""]))
        entries_.append({"name": f"t{i}" if rng.random() < 0.9 else "t0", "dtype": dtype, "shape": shape})
    return {"tensors": entries_}


def test_twenty_thousand_fuzzed_frames_raise_nothing_but_wire_errors() -> None:
    """Signed random tables (the roster peer's attack), bit-flipped and truncated genuine frames
    (an outsider's), 20 000 in all; the counts show every kind was made and reached the parser."""
    rng = np.random.default_rng(30)
    genuine = craft()
    outcomes: dict[str, int] = {}
    for i in range(20_000):
        kind = i % 4
        if kind in (0, 1):
            table = _random_table(rng)
            payload = fitting_data(table, rng) if kind == 0 else None
            if payload is None:
                payload = rng.bytes(int(rng.integers(0, 200)))
            frame = signed_body(table, payload)
        elif kind == 2:
            frame = bytearray(genuine)
            for _ in range(int(rng.integers(1, 4))):
                frame[int(rng.integers(0, len(frame)))] ^= 1 << int(rng.integers(0, 8))
            frame = bytes(frame)
        else:
            frame = genuine[: int(rng.integers(0, len(genuine)))] + rng.bytes(int(rng.integers(0, 64)))
        try:
            open_(frame)
            outcome = "opened"
        except WireError as exc:
            outcome = type(exc).__name__
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert sum(outcomes.values()) == 20_000
    assert {"opened", "MalformedMessage", "BadSignature", "UnknownDtype"} <= set(outcomes), outcomes
