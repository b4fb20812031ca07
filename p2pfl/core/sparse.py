"""Sparse updates with error feedback: the math of issue 50, no networking.

A sender and its receiver both hold a *reference* copy of the sender's part (what the receiver
rebuilt last; at first, a version sent whole). Each round the sender sends only k entries of a
vector `u` against that reference, as sorted flat indices and their values; the receiver adds
them to its reference, and so does the sender to its own copy, so both stay equal bit for bit.

* without error feedback, `u = Δ`, the round's own update (its model minus last round's), and
  what was not sent is dropped;
* with error feedback (Stich et al. 2018; Karimireddy et al. 2019), `u = Δ + e`, where the
  residual `e` is what earlier rounds did not send, and the new residual is `u − sent`.

top-k sends the k entries of largest magnitude (ties: the lower index); random-k sends k entries
drawn uniformly without replacement from a seeded generator, unscaled (with error feedback
nothing is lost, so no 1/fraction rescaling is needed to be unbiased over rounds).
k = ceil(fraction × numel), at least 1 for a non-empty tensor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

SPARSE_KINDS = ("topk", "randomk")


@dataclass(frozen=True)
class SparseTensor:
    """k entries of a tensor of `shape`: flat `indices` (int64, strictly increasing) and `values`."""

    shape: tuple[int, ...]
    indices: torch.Tensor
    values: torch.Tensor

    @property
    def nbytes(self) -> int:
        """What it costs on the wire: its indices and values, never the dense size."""
        return self.indices.numel() * self.indices.element_size() + self.values.numel() * self.values.element_size()

    def dense(self) -> torch.Tensor:
        out = torch.zeros(math.prod(self.shape), dtype=self.values.dtype)
        out[self.indices] = self.values
        return out.reshape(self.shape)


def entries_kept(numel: int, fraction: float) -> int:
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    return min(numel, max(1, math.ceil(fraction * numel))) if numel else 0


def sparsify(u: torch.Tensor, fraction: float, kind: str, generator: torch.Generator | None = None) -> SparseTensor:
    """k entries of `u` (see the module's text)."""
    flat = u.detach().reshape(-1)
    k = entries_kept(flat.numel(), fraction)
    if kind == "topk":
        # A stable sort on -|u|: among equal magnitudes the lower index comes first, so the same
        # update always gives the same entries.
        order = torch.sort(-flat.abs(), stable=True).indices[:k]
    elif kind == "randomk":
        order = torch.randperm(flat.numel(), generator=generator)[:k]
    else:
        raise ValueError(f"unknown sparsification {kind!r}; choose one of {SPARSE_KINDS}")
    indices = torch.sort(order).values.to(torch.int64)
    return SparseTensor(tuple(u.shape), indices, flat[indices].clone())


def check_sparse(name: str, shape: tuple[int, ...], indices: torch.Tensor, values: torch.Tensor) -> None:
    """Raise ValueError naming what is wrong with a sparse tensor that arrived for `name`."""
    numel = math.prod(shape)
    if indices.dim() != 1 or values.dim() != 1:
        raise ValueError(f"{name}: indices and values must be 1-D, got shapes {tuple(indices.shape)} and {tuple(values.shape)}")
    if indices.numel() != values.numel():
        raise ValueError(f"{name}: {indices.numel()} indices but {values.numel()} values")
    if indices.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name}: indices must be int32 or int64, got {indices.dtype}")
    if indices.numel() > numel:
        raise ValueError(f"{name}: {indices.numel()} entries for a tensor of {numel}")
    if indices.numel():
        low, high = int(indices.min()), int(indices.max())
        if low < 0 or high >= numel:
            raise ValueError(f"{name}: index {low if low < 0 else high} out of range [0, {numel})")
        steps = indices[1:] - indices[:-1]
        if bool((steps == 0).any()):
            raise ValueError(f"{name}: repeated index {int(indices[1:][steps == 0][0])}")
        if bool((steps < 0).any()):
            raise ValueError(f"{name}: indices not sorted (at position {int(torch.nonzero(steps < 0)[0]) + 1})")
    if values.is_floating_point() and not bool(torch.isfinite(values).all()):
        raise ValueError(f"{name}: non-finite values")


def rebuild(reference: Mapping[str, torch.Tensor], sent: Mapping[str, SparseTensor]) -> dict[str, torch.Tensor]:
    """The receiver's (and the sender's) new copy: the reference plus what was sent."""
    out = {}
    for name, ref in reference.items():
        if name not in sent:
            out[name] = ref.clone()
            continue
        s = sent[name]
        flat = ref.detach().reshape(-1).clone()
        flat[s.indices] += s.values.to(flat.dtype)
        out[name] = flat.reshape(ref.shape)
    return out


class ErrorFeedback:
    """One sender's state towards the receivers of one part: the shared reference and the residual.

    `step(model)` gives what to send this round and advances both. `error_feedback=False` drops
    what was not sent (the residual stays zero)."""

    def __init__(self, start: Mapping[str, torch.Tensor], fraction: float, kind: str = "topk", *,
                 error_feedback: bool = True, seed: int = 0) -> None:
        entries_kept(1, fraction)  # checks the fraction
        if kind not in SPARSE_KINDS:
            raise ValueError(f"unknown sparsification {kind!r}; choose one of {SPARSE_KINDS}")
        self.fraction, self.kind, self.error_feedback = fraction, kind, error_feedback
        self.reference = {k: v.detach().clone() for k, v in start.items()}  # what the receiver holds
        self.previous = {k: v.detach().clone() for k, v in start.items()}  # the sender's last model
        self.residual = {k: torch.zeros_like(v) for k, v in start.items() if v.is_floating_point()}
        self.generator = torch.Generator().manual_seed(seed)

    def step(self, model: Mapping[str, torch.Tensor]) -> dict[str, SparseTensor]:
        sent: dict[str, SparseTensor] = {}
        for name, residual in self.residual.items():
            u = model[name].detach() - self.previous[name]
            if self.error_feedback:
                u = u + residual
            sent[name] = sparsify(u, self.fraction, self.kind, self.generator)
            if self.error_feedback:
                self.residual[name] = u - sent[name].dense().to(u.dtype)
        self.reference = rebuild(self.reference, sent)
        self.previous = {k: v.detach().clone() for k, v in model.items()}
        return sent
