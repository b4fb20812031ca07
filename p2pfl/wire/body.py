"""Tensor body: msgpack {"tensors": {name: {"dtype", "shape", "data"}}} with raw little-endian data.

Raw buffers plus an explicit dtype allow-list replace pickle/torch.load: decoding can only
ever produce plain numeric arrays, never objects or code.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Union

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
FLOAT_DTYPES: frozenset[str] = frozenset({"float16", "float32", "float64"})

_ENTRY_KEYS = frozenset({"dtype", "shape", "data"})


@dataclass(frozen=True)
class EncodedBody:
    data: bytes
    sha256: bytes
    param_bytes: int


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
    entries: dict[str, dict[str, Any]] = {}
    param_bytes = 0
    for name, value in tensors.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor name {quote(name)} must be a str")
        dtype_name, arr = _as_little_endian_array(name, value)
        # A flat uint8 memoryview lets msgpack copy the buffer straight in (no tobytes()).
        raw = memoryview(arr.reshape(-1).view(np.uint8))
        param_bytes += raw.nbytes
        entries[name] = {"dtype": dtype_name, "shape": list(arr.shape), "data": raw}
    data = msgpack.packb({"tensors": entries}, use_bin_type=True)
    return EncodedBody(data=data, sha256=hashlib.sha256(data).digest(), param_bytes=param_bytes)


def decode_body(buf: memoryview, limits: WireLimits) -> tuple[dict[str, np.ndarray], int]:
    """Parse and validate the body; returns read-only arrays viewing msgpack's bin objects, and param bytes.

    Validation runs in passes so error classes come out in the documented order:
    structure (400), then dtypes (415), then data lengths (400).
    """
    try:
        doc = unpack_strict(buf)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise MalformedMessage(f"body is not valid msgpack: {exc}") from None
    if not isinstance(doc, dict) or set(doc) != {"tensors"}:
        got = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        raise MalformedMessage(f"body must be a map with the single key 'tensors', got {quote(got)}")
    entries = doc["tensors"]
    if not isinstance(entries, dict):
        raise MalformedMessage(f"body 'tensors' must be a map, got {type(entries).__name__}")
    if len(entries) > limits.max_tensors:
        raise MalformedMessage(f"body has {len(entries)} tensors, limit is {limits.max_tensors}")

    for name, entry in entries.items():
        if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS:
            got = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
            raise MalformedMessage(f"tensor {quote(name)} must be a map with keys dtype, shape, data; got {quote(got)}")
        dtype, shape, data = entry["dtype"], entry["shape"], entry["data"]
        if not isinstance(dtype, str):
            raise MalformedMessage(f"tensor {quote(name)} dtype must be a string, got {type(dtype).__name__}")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise MalformedMessage(f"tensor {quote(name)} shape must be a list of non-negative ints, got {quote(shape)}")
        if len(shape) > limits.max_ndim:
            raise MalformedMessage(f"tensor {quote(name)} has {len(shape)} dims, limit is {limits.max_ndim}")
        if not isinstance(data, bytes):
            raise MalformedMessage(f"tensor {quote(name)} data must be msgpack bin, got {type(data).__name__}")

    for name, entry in entries.items():
        if entry["dtype"] not in DTYPES:
            raise UnknownDtype(
                f"tensor {quote(name)} has dtype {quote(entry['dtype'])}; accepted: {', '.join(sorted(DTYPES))}"
            )

    arrays: dict[str, np.ndarray] = {}
    param_bytes = 0
    for name, entry in entries.items():
        dtype = _NP_DTYPES[entry["dtype"]]
        shape = tuple(entry["shape"])
        data = entry["data"]
        want = math.prod(shape) * dtype.itemsize
        if len(data) != want:
            raise MalformedMessage(
                f"tensor {quote(name)} has {len(data)} data bytes, expected {want} for shape {shape} {entry['dtype']}"
            )
        # frombuffer on immutable bytes: a read-only view, no copy; reshape of it is a view too.
        arrays[name] = np.frombuffer(data, dtype=dtype).reshape(shape)
        param_bytes += want
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
        if arr.dtype.name != dtype:
            raise ShapeMismatch(f"tensor {quote(name)} has dtype {arr.dtype.name}, expected {dtype}")


def check_finite(arrays: Mapping[str, np.ndarray]) -> None:
    for name, arr in arrays.items():
        if arr.dtype.name in FLOAT_DTYPES and arr.size and not np.isfinite(arr).all():
            n_nan = int(np.isnan(arr).sum())
            n_inf = int(np.isinf(arr).sum())
            raise NonFiniteValues(f"tensor {quote(name)} has {n_nan} NaN and {n_inf} Inf values")
