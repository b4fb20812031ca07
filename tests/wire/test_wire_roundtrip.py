"""Round trips, zero-copy decoding and byte accounting."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
import torch

from p2pfl.wire import (
    DTYPES,
    MAGIC,
    PROTOCOL_VERSION,
    Header,
    Message,
    NodeKey,
    ReplayGuard,
    Roster,
    UnknownDtype,
    encode,
    encode_body,
    open_message,
    peek_header,
    seal,
)

KEY = NodeKey.generate()
ROSTER = Roster({"alice": KEY.public_hex})


def _frame(tensors, *, seq: int = 1, meta=None, recipient: str = "bob", **kw) -> bytes:
    fields = dict(kind="model", sender="alice", recipient=recipient, round=3, version=7, seq=seq, part="full")
    fields.update(kw)
    return encode(key=KEY, meta=meta if meta is not None else {"n": 1}, tensors=tensors, **fields)


def _open(frame: bytes, **kw) -> Message:
    return open_message(frame, roster=ROSTER, recipient="bob", replay=ReplayGuard(), **kw)


def _sample_arrays() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "f32": rng.standard_normal((3, 4)).astype(np.float32),
        "f64": rng.standard_normal((2, 3, 5)),
        "f16": rng.standard_normal(7).astype(np.float16),
        "i64": rng.integers(-(2**62), 2**62, size=(4, 1), dtype=np.int64),
        "i32": rng.integers(-(2**31), 2**31, size=6, dtype=np.int32),
        "i16": rng.integers(-(2**15), 2**15, size=(2, 2), dtype=np.int16),
        "i8": rng.integers(-128, 128, size=9, dtype=np.int8),
        "u8": rng.integers(0, 256, size=(3, 3), dtype=np.uint8),
        "bool": rng.integers(0, 2, size=(5,)).astype(bool),
        "scalar": np.array(2.5, dtype=np.float32),
        "scalar_i": np.array(-3, dtype=np.int64),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "empty_1d": np.zeros((0,), dtype=np.int8),
        "deep": np.arange(2**8, dtype=np.float32).reshape((2,) * 8),
        # Special floats must survive bit-for-bit (only NaN/Inf are rejected).
        "specials": np.array([0.0, -0.0, np.finfo(np.float32).tiny / 2, np.finfo(np.float32).max], dtype=np.float32),
    }


def test_sample_covers_every_dtype() -> None:
    assert {a.dtype.name for a in _sample_arrays().values()} == DTYPES


def test_numpy_round_trip_is_bitwise_equal() -> None:
    arrays = _sample_arrays()
    msg = _open(_frame(arrays))
    assert list(msg.tensors) == list(arrays)  # order preserved
    for name, arr in arrays.items():
        got = msg.tensors[name]
        assert got.dtype == arr.dtype, name
        assert got.shape == arr.shape, name
        assert got.tobytes() == arr.tobytes(), name


def test_torch_round_trip_including_awkward_inputs() -> None:
    base = torch.randn(4, 6)
    tensors = {
        "plain": torch.randn(5, 3),
        "grad": torch.randn(3, requires_grad=True),
        "transposed": base.t(),  # non-contiguous
        "sliced": base[:, ::2],
        "scalar": torch.tensor(1.25, dtype=torch.float64),
        "empty": torch.zeros(0, 3, dtype=torch.int32),
        "mask": torch.tensor([True, False, True]),
        "half": torch.randn(4).half(),
    }
    msg = _open(_frame(tensors))
    out = msg.torch_tensors()
    for name, t in tensors.items():
        assert out[name].dtype == t.dtype, name
        assert out[name].shape == t.shape, name
        assert torch.equal(out[name], t.detach()), name


def test_big_endian_numpy_input_is_normalised() -> None:
    arr = np.arange(5, dtype=">f8")
    got = _open(_frame({"be": arr})).tensors["be"]
    assert got.dtype == np.dtype("<f8")
    np.testing.assert_array_equal(got, arr)


def test_header_fields_round_trip() -> None:
    meta = {"loss": 0.25, "samples": 120, "tags": ["a", "b"], "nested": {"ok": True, "none": None}}
    frame = _frame({"w": np.ones(2, np.float32)}, seq=42, meta=meta, part="body", timestamp=1_700_000_000.5)
    guard = ReplayGuard(clock=lambda: 1_700_000_010.0)
    msg = open_message(frame, roster=ROSTER, recipient="bob", replay=guard)
    h = msg.header
    assert (h.kind, h.sender, h.recipient, h.round, h.version, h.seq, h.part) == (
        "model", "alice", "bob", 3, 7, 42, "body"
    )
    assert h.timestamp == 1_700_000_000.5
    assert h.meta == meta
    assert h.protocol == PROTOCOL_VERSION
    assert peek_header(frame) == h


def test_frame_layout() -> None:
    frame = _frame({"w": np.ones(3, np.float32)})
    assert frame[:4] == MAGIC == b"P2FL"
    assert frame[4] == PROTOCOL_VERSION
    header_len = int.from_bytes(frame[5:9], "big")
    body = encode_body({"w": np.ones(3, np.float32)})
    start = 9 + header_len + 64
    body_start = start + (-start % 64)  # zero padding: the body starts at a multiple of 64
    assert frame[start:body_start] == bytes(body_start - start)
    assert len(frame) == body_start + len(body.data) and frame.endswith(body.data)
    table_len = int.from_bytes(body.data[:4], "little")
    data_start = 4 + table_len + (-(4 + table_len) % 64)
    assert body.data[data_start:] == np.ones(3, np.float32).tobytes()


def test_tensor_data_is_aligned_and_not_copied_when_encoding() -> None:
    arrays = {"a": np.arange(3, dtype=np.int8), "b": np.ones((5, 7), np.float64), "c": np.array(2.0, np.float32)}
    body = encode_body(arrays)
    views = [c for c in body.chunks if isinstance(c, memoryview)]
    assert [np.frombuffer(v, np.uint8).ctypes.data for v in views] == [a.ctypes.data for a in arrays.values()]
    frame = _frame(arrays)
    msg = _open(frame)
    for name, arr in arrays.items():
        np.testing.assert_array_equal(msg.tensors[name], arr)
    offsets = [msg.tensors[n].ctypes.data - msg.tensors["a"].ctypes.data for n in arrays]
    assert all(o % 64 == 0 for o in offsets)


def test_decoded_arrays_are_read_only_views_not_copies() -> None:
    arrays = {f"t{i}": np.full((64, 33), i, dtype=np.float32) for i in range(4)}
    arrays["scalar"] = np.array(1.0)
    frame = _frame(arrays)
    msg = _open(frame)
    torch_views = msg.torch_tensors()
    for name, arr in msg.tensors.items():
        assert not arr.flags.writeable, name
        assert not arr.flags.owndata, name
        root = arr
        while isinstance(root, np.ndarray):
            root = root.base
        if isinstance(root, memoryview):
            root = root.obj
        # The memory belongs to the received frame itself: any astype/copy/np.array on the
        # way would have produced an array owning its data.
        assert root is frame, name
        assert np.shares_memory(arr, np.frombuffer(root, dtype=np.uint8)), name
        # torch_tensors() must share memory too, not copy.
        assert torch_views[name].data_ptr() == arr.__array_interface__["data"][0], name


def test_decoding_allocates_about_one_body_not_two() -> None:
    # 8 tensors x 1 MiB. msgpack's unpacking necessarily materialises each bin once; a
    # per-tensor copy after that (tobytes, astype, copy) would double the peak.
    arrays = {f"t{i}": np.full(2**18, float(i), dtype=np.float32) for i in range(8)}
    frame = _frame(arrays)
    body_bytes = sum(a.nbytes for a in arrays.values())
    tracemalloc.start()
    try:
        msg = _open(frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(msg.tensors) == 8
    assert peak < 1.5 * body_bytes, f"peak {peak} bytes for a {body_bytes}-byte body"


def test_param_and_meta_bytes() -> None:
    arrays = {
        "conv.weight": np.zeros((8, 3, 5, 5), np.float32),
        "conv.bias": np.zeros(8, np.float32),
        "fc.weight": np.zeros((10, 32), np.float32),
        "fc.bias": np.zeros(10, np.float32),
    }
    frame = _frame(arrays, meta={"samples": 100, "loss": 0.5})
    msg = _open(frame)
    assert msg.param_bytes == sum(a.nbytes for a in arrays.values())
    assert msg.total_bytes == len(frame)
    assert msg.meta_bytes == len(frame) - msg.param_bytes
    assert 0 < msg.meta_bytes < 1024
    body = encode_body(arrays)
    assert body.param_bytes == msg.param_bytes


def test_encoded_body_can_be_sealed_for_many_recipients() -> None:
    arrays = {"w": np.arange(10, dtype=np.float32)}
    body = encode_body(arrays)
    roster = Roster({"srv": KEY.public_hex})
    for seq, who in enumerate(["bob", "carol"]):
        frame = seal(key=KEY, kind="model", sender="srv", recipient=who, round=0, version=1, seq=seq,
                     part="global", meta={}, body=body)
        msg = open_message(frame, roster=roster, recipient=who, replay=ReplayGuard())
        assert msg.header.recipient == who
        np.testing.assert_array_equal(msg.tensors["w"], arrays["w"])


def test_expected_accepts_exact_match() -> None:
    arrays = {"a": np.zeros((2, 3), np.float32), "b": np.zeros(4, np.int64)}
    msg = _open(_frame(arrays), expected={"a": ((2, 3), "float32"), "b": ((4,), "int64")})
    assert set(msg.tensors) == {"a", "b"}


@pytest.mark.parametrize(
    "value",
    [torch.zeros(2, dtype=torch.bfloat16), torch.zeros(2, dtype=torch.complex64), np.zeros(2, np.complex64),
     np.array(["x"]), np.zeros(2, np.uint16)],
    ids=["bfloat16", "torch-complex", "np-complex", "str", "uint16"],
)
def test_encode_rejects_unlisted_dtypes(value) -> None:
    with pytest.raises(UnknownDtype) as exc:
        encode_body({"bad": value})
    assert exc.value.status == 415
    assert "'bad'" in str(exc.value)


def test_encode_rejects_non_tensors_and_bad_meta() -> None:
    with pytest.raises(TypeError):
        encode_body({"x": [1.0, 2.0]})
    with pytest.raises(TypeError):
        _frame({"w": np.ones(1, np.float32)}, meta={"blob": b"bytes"})
    with pytest.raises(TypeError):
        _frame({"w": np.ones(1, np.float32)}, meta={"obj": object()})


def test_header_is_a_frozen_dataclass() -> None:
    h = peek_header(_frame({"w": np.ones(1, np.float32)}))
    assert isinstance(h, Header)
    with pytest.raises(AttributeError):
        h.seq = 5  # type: ignore[misc]


@pytest.mark.slow
def test_torch_tensors_emits_no_non_writable_warning() -> None:
    # torch warns only once per process, so check in a fresh interpreter with warnings as errors.
    code = (
        "import numpy as np\n"
        "from p2pfl.wire import NodeKey, Roster, encode, open_message\n"
        "k = NodeKey.generate()\n"
        "f = encode(key=k, kind='m', sender='a', recipient='b', round=0, version=0, seq=0, part='', meta={},\n"
        "           tensors={'w': np.ones(3, np.float32)})\n"
        "t = open_message(f, roster=Roster({'a': k.public_hex}), recipient='b', replay=None).torch_tensors()\n"
        "assert t['w'].sum().item() == 3.0\n"
    )
    result = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("warn_always", [False, True])
@pytest.mark.slow
def test_decoded_tensors_raise_no_warning_first_or_later(warn_always: bool) -> None:
    """Torch warns once per process that a read-only array makes a tensor it cannot protect: the
    first decode keeps that quiet, and the later ones (without the guard) have nothing to quiet,
    unless torch is told to warn always, when every decode keeps it quiet."""
    code = (
        "import warnings, torch\n"
        f"torch.set_warn_always({warn_always})\n"
        "warnings.simplefilter('error')\n"
        "from p2pfl.wire import NodeKey, Roster, encode, open_message\n"
        "key = NodeKey.generate()\n"
        "for seq in (1, 2, 3):\n"
        "    frame = encode(key=key, kind='model', sender='a', recipient='b', round=1, version=1, seq=seq,\n"
        "                   part='full', meta={}, tensors={'w': torch.ones(3)})\n"
        "    message = open_message(frame, roster=Roster({'a': key.public_hex}), recipient='b', replay=None)\n"
        "    assert torch.equal(message.torch_tensors()['w'], torch.ones(3))\n"
        "print('quiet')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "quiet", done.stderr[-2000:]
