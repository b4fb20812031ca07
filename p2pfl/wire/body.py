"""Tensor body: a msgpack tensor table followed by the raw little-endian tensor bytes.

    u32 table length (LE) | table msgpack {"tensors": [{"name", "dtype", "shape"}, ...]}
    | zero padding | tensor 0 data | zero padding | tensor 1 data | ...

Every tensor's data starts at a multiple of `ALIGN` bytes from the start of the body, and
the frame places the body at a multiple of `ALIGN` too, so decoded arrays are aligned
views of the received buffer. Encoding writes no tensor byte: the body is a list of
buffers (the table and memoryviews of the tensors), hashed in place and written to the
socket as they are. Decoding copies nothing either. Raw buffers plus an explicit dtype
allow-list replace pickle/torch.load: decoding can only ever produce plain numeric arrays.
"""

from __future__ import annotations

import math
import struct
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

import blake3
import msgpack
import numpy as np

from p2pfl.wire.errors import MalformedMessage, NonFiniteValues, ShapeMismatch, UnknownDtype, quote
from p2pfl.wire.limits import WireLimits

if TYPE_CHECKING:
    import torch

    TensorLike = Union[torch.Tensor, np.ndarray]
else:
    TensorLike = Any

# Byte order is pinned to little-endian so peers on any platform agree on the bytes.
_NP_DTYPES: dict[str, np.dtype] = {
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "float16": np.dtype("<f2"),
    "int64": np.dtype("<i8"),
    "int32": np.dtype("<i4"),
    "int16": np.dtype("<i2"),
    "int8": np.dtype("i1"),
    "uint8": np.dtype("u1"),
    "bool": np.dtype("?"),
}
DTYPES: frozenset[str] = frozenset(_NP_DTYPES)

ALIGN = 64
DIGEST_BYTES = 32
_TABLE_LEN = struct.Struct("<I")
_ENTRY_KEYS = frozenset({"name", "dtype", "shape"})
# BLAKE3 spreads one update over all cores; below this size threads cost more than they save.
_THREADED_DIGEST_BYTES = 1 << 20
_ZERO_PAD = bytes(ALIGN)


def padding(offset: int) -> int:
    """Zero bytes needed after `offset` to reach the next multiple of ALIGN."""
    return -offset % ALIGN


def digest(chunks: Sequence[bytes | memoryview]) -> bytes:
    """BLAKE3 of the concatenation of `chunks`, hashed in place.

    Multi-threaded only when the chunks are large on average: each threaded `update` pays a
    dispatch, which costs more than it saves on the many small tensors of a small model."""
    total = sum(memoryview(c).nbytes for c in chunks)
    threaded = total >= _THREADED_DIGEST_BYTES and total >= _THREADED_DIGEST_BYTES * len(chunks)
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO if threaded else 1)
    for chunk in chunks:
        hasher.update(chunk)
    return hasher.digest()


@dataclass(frozen=True)
class EncodedBody:
    """An encoded body as a list of buffers; `chunks` reference the tensors' memory, they are not copies."""

    chunks: tuple[bytes | memoryview, ...]
    nbytes: int
    digest: bytes
    param_bytes: int

    @property
    def data(self) -> bytes:
        """The body as one bytes object (a copy; the transport writes `chunks` instead)."""
        return b"".join(self.chunks)


def _reject_ext(code: int, data: bytes) -> Any:
    # msgpack extension types (timestamps, custom objects) have no place in the format.
    raise ValueError(f"msgpack extension type {code} is not allowed")


def unpack_strict(buf: memoryview | bytes) -> Any:
    """msgpack decode with no extension types, str keys only, and UTF-8 strings."""
    return msgpack.unpackb(buf, raw=False, strict_map_key=True, ext_hook=_reject_ext, timestamp=0)


def _as_little_endian_array(name: str, value: TensorLike) -> tuple[str, np.ndarray]:
    torch_mod = sys.modules.get("torch")  # avoid importing torch just to isinstance-check
    if torch_mod is not None and isinstance(value, torch_mod.Tensor):
        dtype_name = str(value.dtype).removeprefix("torch.")
        if dtype_name not in DTYPES:
            raise UnknownDtype(f"tensor {quote(name)} has dtype {dtype_name}; accepted: {', '.join(sorted(DTYPES))}")
        if value.layout != torch_mod.strided:
            raise TypeError(f"tensor {quote(name)} has layout {value.layout}; only dense tensors can be encoded")
        t = value.detach().to("cpu").resolve_conj().resolve_neg().contiguous()
        arr = t.numpy()
    elif isinstance(value, (np.ndarray, np.generic)):
        value = np.asarray(value)  # numpy scalars (e.g. from reductions) become 0-d arrays
        dtype_name = value.dtype.name
        if dtype_name not in DTYPES or value.dtype.kind not in "fiub":
            raise UnknownDtype(f"tensor {quote(name)} has dtype {value.dtype}; accepted: {', '.join(sorted(DTYPES))}")
        arr = value
    else:
        raise TypeError(f"tensor {quote(name)}: expected torch.Tensor or numpy.ndarray, got {type(value).__name__}")
    wire_dtype = _NP_DTYPES[dtype_name]
    if arr.dtype != wire_dtype:  # only differs in byte order on big-endian input
        arr = arr.astype(wire_dtype)
    # Not np.ascontiguousarray: it promotes 0-d arrays to shape (1,).
    return dtype_name, arr if arr.flags.c_contiguous else arr.copy(order="C")


def encode_body(tensors: Mapping[str, TensorLike]) -> EncodedBody:
    """Table plus zero-copy views of the tensors' bytes. The caller must not change the tensors
    until the body is sent (the runtime publishes host snapshots, see `p2pfl.runtime.devices`)."""
    table: list[dict[str, Any]] = []
    views: list[memoryview] = []
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor name {quote(name)} must be a str")
        dtype_name, arr = _as_little_endian_array(name, value)
        table.append({"name": name, "dtype": dtype_name, "shape": list(arr.shape)})
        views.append(memoryview(arr.reshape(-1).view(np.uint8)))
    packed = msgpack.packb({"tensors": table}, use_bin_type=True)
    head = _TABLE_LEN.pack(len(packed)) + packed
    chunks: list[bytes | memoryview] = [head]
    offset = len(head)
    param_bytes = 0
    for view in views:
        pad = padding(offset)
        if pad:
            chunks.append(_ZERO_PAD[:pad])
            offset += pad
        if view.nbytes:
            chunks.append(view)
        offset += view.nbytes
        param_bytes += view.nbytes
    return EncodedBody(chunks=tuple(chunks), nbytes=offset, digest=digest(chunks), param_bytes=param_bytes)


def _read_table(buf: memoryview, limits: WireLimits) -> tuple[list[dict[str, Any]], int]:
    if buf.nbytes < _TABLE_LEN.size:
        raise MalformedMessage(f"body is {buf.nbytes} bytes, too short for its {_TABLE_LEN.size}-byte table length")
    (table_len,) = _TABLE_LEN.unpack_from(buf)
    end = _TABLE_LEN.size + table_len
    if end > buf.nbytes:
        raise MalformedMessage(f"tensor table of {table_len} bytes overruns the {buf.nbytes}-byte body")
    try:
        doc = unpack_strict(buf[_TABLE_LEN.size:end])
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise MalformedMessage(f"tensor table is not valid msgpack: {exc}") from None
    if not isinstance(doc, dict) or set(doc) != {"tensors"}:
        got = sorted(doc, key=str) if isinstance(doc, dict) else type(doc).__name__
        raise MalformedMessage(f"tensor table must be a map with the single key 'tensors', got {quote(got)}")
    entries = doc["tensors"]
    if not isinstance(entries, list):
        raise MalformedMessage(f"tensor table 'tensors' must be a list, got {type(entries).__name__}")
    if len(entries) > limits.max_tensors:
        raise MalformedMessage(f"body has {len(entries)} tensors, limit is {limits.max_tensors}")
    return entries, end


def decode_body(buf: memoryview, limits: WireLimits) -> tuple[dict[str, np.ndarray], int]:
    """Parse and validate the body; returns read-only arrays viewing `buf`, and param bytes.

    Validation runs in passes so error classes come out in the documented order:
    structure (400), then dtypes (415), then data lengths (400).
    """
    entries, offset = _read_table(buf, limits)
    names: set[str] = set()
    for entry in entries:
        if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS:
            got = sorted(entry, key=str) if isinstance(entry, dict) else type(entry).__name__
            raise MalformedMessage(f"tensor entry must be a map with keys name, dtype, shape; got {quote(got)}")
        name, dtype, shape = entry["name"], entry["dtype"], entry["shape"]
        if not isinstance(name, str):
            raise MalformedMessage(f"tensor name must be a string, got {type(name).__name__}")
        if name in names:
            raise MalformedMessage(f"tensor {quote(name)} appears twice")
        names.add(name)
        if not isinstance(dtype, str):
            raise MalformedMessage(f"tensor {quote(name)} dtype must be a string, got {type(dtype).__name__}")
        # A dimension larger than the message is impossible unless another one is 0; bounding
        # each keeps the products below from overflowing numpy's index type.
        if not isinstance(shape, list) or not all(type(d) is int and 0 <= d <= limits.max_message_bytes for d in shape):
            raise MalformedMessage(
                f"tensor {quote(name)} shape must be a list of ints in [0, {limits.max_message_bytes}], got {quote(shape)}"
            )
        if len(shape) > limits.max_ndim:
            raise MalformedMessage(f"tensor {quote(name)} has {len(shape)} dims, limit is {limits.max_ndim}")
        # A 0 among the dims makes the size 0 whatever the others are, but numpy still refuses a
        # shape whose other dims multiply past its index range: the shape is checked as a whole.
        if math.prod(d for d in shape if d) > limits.max_message_bytes:
            raise MalformedMessage(f"tensor {quote(name)} shape {quote(shape)} multiplies past the "
                                   f"{limits.max_message_bytes}-byte message limit (its zero dims aside)")

    for entry in entries:
        if entry["dtype"] not in DTYPES:
            raise UnknownDtype(
                f"tensor {quote(entry['name'])} has dtype {quote(entry['dtype'])}; accepted: {', '.join(sorted(DTYPES))}"
            )

    layout: list[tuple[str, np.dtype, tuple[int, ...], int]] = []
    for entry in entries:
        dtype = _NP_DTYPES[entry["dtype"]]
        shape = tuple(entry["shape"])
        offset += padding(offset)
        nbytes = math.prod(shape) * dtype.itemsize
        layout.append((entry["name"], dtype, shape, offset))
        offset += nbytes
        if offset > buf.nbytes:
            raise MalformedMessage(
                f"tensor {quote(entry['name'])} ({entry['dtype']} {list(shape)}) overruns the {buf.nbytes}-byte body"
            )
    if offset != buf.nbytes:
        raise MalformedMessage(f"body has {buf.nbytes - offset} bytes after the last tensor's data")

    arrays: dict[str, np.ndarray] = {}
    param_bytes = 0
    for name, dtype, shape, start in layout:
        count = math.prod(shape)
        # frombuffer on the received bytes: a read-only view, no copy; reshape of it is a view too.
        arrays[name] = np.frombuffer(buf, dtype=dtype, count=count, offset=start).reshape(shape)
        param_bytes += count * dtype.itemsize
    return arrays, param_bytes


def _fmt_names(names: set[str], limit: int = 5) -> str:
    ordered = sorted(names)
    text = ", ".join(quote(n) for n in ordered[:limit])
    return text + (f" and {len(ordered) - limit} more" if len(ordered) > limit else "")


def check_expected(arrays: Mapping[str, np.ndarray], expected: Mapping[str, tuple[tuple[int, ...], str]]) -> None:
    missing = set(expected) - set(arrays)
    extra = set(arrays) - set(expected)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing tensors {_fmt_names(missing)}")
        if extra:
            parts.append(f"unexpected tensors {_fmt_names(extra)}")
        raise ShapeMismatch("; ".join(parts))
    for name, (shape, dtype) in expected.items():
        arr = arrays[name]
        if arr.shape != tuple(shape):
            raise ShapeMismatch(f"tensor {quote(name)} has shape {arr.shape}, expected {tuple(shape)}")
        if arr.dtype != _NP_DTYPES.get(dtype):  # np.dtype.name is slow enough to show per message
            raise ShapeMismatch(f"tensor {quote(name)} has dtype {arr.dtype.name}, expected {dtype}")


_FINITE_CHUNK = 1 << 16
_ZEROS = {np.dtype("<f4"): np.zeros(_FINITE_CHUNK, np.float32), np.dtype("<f8"): np.zeros(_FINITE_CHUNK, np.float64)}


def all_finite(arr: np.ndarray) -> bool:
    """True if no element is NaN or ±Inf, without a temporary the size of `arr`.

    x·0 is 0 for every finite x and NaN for NaN and ±Inf, so a dot product with zeros is 0
    exactly when all elements are finite; BLAS streams it at memory speed, in cache-sized chunks.
    """
    flat = arr.reshape(-1)
    zeros = _ZEROS.get(flat.dtype)
    if zeros is None:  # float16 has no BLAS dot
        return bool(np.isfinite(flat).all())
    with np.errstate(invalid="ignore", over="ignore"):
        for start in range(0, flat.size, _FINITE_CHUNK):
            chunk = flat[start : start + _FINITE_CHUNK]
            if np.dot(chunk, zeros[: chunk.size]) != 0:
                return False
    return True


def check_finite(arrays: Mapping[str, np.ndarray]) -> None:
    for name, arr in arrays.items():
        if arr.dtype.kind == "f" and arr.size and not all_finite(arr):
            n_nan = int(np.isnan(arr).sum())
            n_inf = int(np.isinf(arr).sum())
            raise NonFiniteValues(f"tensor {quote(name)} has {n_nan} NaN and {n_inf} Inf values")
