"""Wire precision: how a node's shared parameters are quantised for transfer.

`runtime.wire_precision` is one scenario field, so every node knows what its peers send:

* `float32`: parameters as they are;
* `float16`: each floating tensor cast to half precision (half the bytes);
* `int8`: each floating tensor `x` sent as `q = round(x / s)` in [-127, 127] with one float32
  scale `s = max|x| / 127` per tensor (a quarter of the bytes), as the tensor `<name>#scale`.

Integer buffers (BatchNorm's `num_batches_tracked`) always travel as they are. The receiver
validates what arrives against the quantised spec (names, shapes, dtypes, finite values: a
half-precision overflow arrives as Inf and is refused like any non-finite tensor), then
dequantises into the model's own dtypes before a strategy sees it. Quantisation is a
property of the transfer only: the sender keeps its full-precision model.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from p2pfl.runtime.settings import WIRE_PRECISIONS  # noqa: F401  (its home for the schema, named here too)

SCALE_SUFFIX = "#scale"  # '#' never occurs in a state-dict name, so it cannot collide with one
INT8_LEVELS = 127  # symmetric: -127..127, so that 0 is exact and the range is its own negation

Spec = dict[str, tuple[tuple[int, ...], str]]


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def quantize(tensors: Mapping[str, torch.Tensor], precision: str) -> dict[str, torch.Tensor]:
    """The tensors as they go on the wire at `precision`."""
    if precision == "float32":
        return dict(tensors)
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if not t.is_floating_point():
            out[name] = t
        elif precision == "float16":
            out[name] = t.to(torch.float16)
        else:
            scale = t.detach().abs().max().to(torch.float32) / INT8_LEVELS if t.numel() else torch.zeros(())
            safe = scale if float(scale) > 0 else torch.ones(())
            out[name] = torch.round(t.to(torch.float32) / safe).clamp_(-INT8_LEVELS, INT8_LEVELS).to(torch.int8)
            out[name + SCALE_SUFFIX] = scale.reshape(())
    return out


def wire_spec(spec: Spec, precision: str) -> Spec:
    """What a part with model spec `spec` looks like on the wire at `precision`."""
    if precision == "float32":
        return dict(spec)
    out: Spec = {}
    for name, (shape, dtype) in spec.items():
        if not _is_float(dtype):
            out[name] = (shape, dtype)
        elif precision == "float16":
            out[name] = (shape, "float16")
        else:
            out[name] = (shape, "int8")
            out[name + SCALE_SUFFIX] = ((), "float32")
    return out


def dequantize(tensors: Mapping[str, torch.Tensor], spec: Spec, precision: str) -> dict[str, torch.Tensor]:
    """Tensors received at `precision`, back in the dtypes of the model spec `spec`. The caller
    has already checked them against `wire_spec(spec, precision)`."""
    if precision == "float32":
        return dict(tensors)
    out: dict[str, torch.Tensor] = {}
    for name, (_, dtype) in spec.items():
        t = tensors[name]
        if not _is_float(dtype):
            out[name] = t
            continue
        target = getattr(torch, dtype)
        if precision == "float16":
            out[name] = t.to(target)
        else:
            out[name] = (t.to(torch.float32) * tensors[name + SCALE_SUFFIX].to(t.device)).to(target)
    return out
