"""Sparse model parts on the wire (`runtime.wire_sparsity = "topk:0.01"`), with error feedback.

A node publishes one version of a part for every reader, so what it sparsifies is taken against
one *public copy* of its part that every reader rebuilds the same way (CHOCO-SGD's x̂): at
first the initial model, which every node builds from the same seed (version 0); after each
round, the last public copy plus the entries sent. With error feedback (`runtime.error_feedback`)
what is sent is the top-k (or random-k) of the model minus the public copy, so nothing is ever
dropped, only delayed (`p2pfl.core.sparse.ErrorFeedback`; the two forms are equal).

On the wire, part P at version v carries, for each floating tensor `n`, `n#idx` (int32, k sorted
flat indices) and `n#val` (float32, their values), k = ceil(fraction × numel); other tensors go
whole. Its metadata names the public copy it is against (`sparse_base`, a version). The node
also publishes `P#ref`, the new public copy, whole: a reader that does not hold the base (it
skipped a round, joined late, or the sender restarted: base -1) reads that instead, and pays
its full size. A reader checks a sparse part's indices (in range, strictly increasing) and
refuses it, naming why, before it rebuilds anything.

Differential privacy is applied before this (DP-SGD in training, output noise on the published
model): sparsifying is post-processing of a private output, so epsilon does not change.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from p2pfl.core.sparse import ErrorFeedback, SparseTensor, check_sparse, entries_kept, rebuild
from p2pfl.runtime.peer_claims import ClaimRefused
from p2pfl.runtime.settings import Sparsity

INDEX_SUFFIX, VALUE_SUFFIX, REF_SUFFIX = "#idx", "#val", "#ref"
BASE_META = "sparse_base"
RESTARTED = -1  # a sparse_base no reader holds: read the public copy whole

Spec = dict[str, tuple[tuple[int, ...], str]]


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def sparse_spec(spec: Spec, fraction: float) -> Spec:
    """What a part with model spec `spec` looks like on the wire, sparse."""
    out: Spec = {}
    for name, (shape, dtype) in spec.items():
        if _is_float(dtype):
            k = entries_kept(int(torch.Size(shape).numel()), fraction)
            out[name + INDEX_SUFFIX] = ((k,), "int32")
            out[name + VALUE_SUFFIX] = ((k,), "float32")
        else:
            out[name] = (shape, dtype)
    return out


def reference_spec(spec: Spec) -> Spec:
    """The public copy `P#ref` travels whole, its floating tensors as float32."""
    return {name: (shape, "float32" if _is_float(dtype) else dtype) for name, (shape, dtype) in spec.items()}


class SparseRefused(ClaimRefused):
    reason = "sparse_malformed"


class NeedReference(Exception):
    """A sparse part against a public copy this node does not hold: read `P#ref` whole."""


class SparseSender:
    """A node's public copy of each part it shares, and what it sends against it each round."""

    def __init__(self, initial: Mapping[str, Mapping[str, torch.Tensor]], sparsity: Sparsity, *,
                 error_feedback: bool, seed: int) -> None:
        self.sparsity, self.error_feedback, self.seed = sparsity, error_feedback, seed
        self.base = 0
        self.feedback = {part: self._start(tensors, i) for i, (part, tensors) in enumerate(sorted(initial.items()))}

    def _start(self, tensors: Mapping[str, torch.Tensor], i: int) -> ErrorFeedback:
        floats = {k: v.detach().to("cpu", torch.float32) for k, v in tensors.items() if v.is_floating_point()}
        return ErrorFeedback(floats, self.sparsity.fraction, self.sparsity.kind, error_feedback=self.error_feedback,
                             seed=self.seed * 1009 + i)

    def restart(self, current: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
        """After a restore: the readers' copies of this node are unknown; its next version is read whole."""
        self.feedback = {part: self._start(tensors, i) for i, (part, tensors) in enumerate(sorted(current.items()))}
        self.base = RESTARTED

    def encode(self, version: int, parts: Mapping[str, Mapping[str, torch.Tensor]]) -> tuple[dict[str, dict[str, torch.Tensor]], int]:
        """The wire tensors of `parts` at `version` (each sparse part and its public copy) and the
        base they are against; the public copies advance."""
        out: dict[str, dict[str, torch.Tensor]] = {}
        base = self.base
        for part, tensors in parts.items():
            feedback = self.feedback[part]
            sent = feedback.step({k: v.detach().to("cpu", torch.float32) for k, v in tensors.items()
                                  if v.is_floating_point()})
            wire: dict[str, torch.Tensor] = {}
            for name, tensor in tensors.items():
                if name in sent:
                    wire[name + INDEX_SUFFIX] = sent[name].indices.to(torch.int32)
                    wire[name + VALUE_SUFFIX] = sent[name].values.to(torch.float32)
                else:
                    wire[name] = tensor
            out[part] = wire
            out[part + REF_SUFFIX] = {**{k: v for k, v in tensors.items() if not v.is_floating_point()},
                                      **{k: v.clone() for k, v in feedback.reference.items()}}
        self.base = version
        return out, base


class SparseReceiver:
    """The public copy of each (peer, part) this node holds, and the version it is at."""

    def __init__(self, initial: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
        self.initial = {part: {k: v.detach().to("cpu", torch.float32, copy=True) for k, v in t.items()
                               if v.is_floating_point()} for part, t in initial.items()}
        self.held: dict[tuple[str, str], tuple[int, dict[str, torch.Tensor]]] = {}

    def _held(self, peer: str, part: str) -> tuple[int, dict[str, torch.Tensor]]:
        return self.held.get((peer, part), (0, self.initial[part]))

    def rebuild(self, peer: str, part: str, version: int, base: int, wire: Mapping[str, torch.Tensor],
                spec: Spec) -> dict[str, torch.Tensor]:
        """`peer`'s part at `version` from its sparse tensors against public copy `base`, checked
        (ClaimRefused naming what is wrong); NeedReference when this node does not hold `base`."""
        if not (base == RESTARTED or 0 <= base < version):
            raise SparseRefused(f"{peer}/{part} version {version} is against version {base}, which cannot precede it")
        sent: dict[str, SparseTensor] = {}
        for name, (shape, dtype) in spec.items():
            if not _is_float(dtype):
                continue
            indices, values = wire[name + INDEX_SUFFIX].to(torch.int64), wire[name + VALUE_SUFFIX]
            try:
                check_sparse(f"{peer}/{part}/{name}", shape, indices, values)
            except ValueError as exc:
                raise SparseRefused(f"sparse part refused: {exc}") from None
            sent[name] = SparseTensor(shape, indices, values)
        held_version, held = self._held(peer, part)
        if base == RESTARTED or held_version != base:
            raise NeedReference(f"{peer}/{part} version {version} is against version {base}; this node holds "
                                f"{held_version}")
        public = rebuild(held, sent)
        self.held[(peer, part)] = (version, public)
        return {**{k: v for k, v in wire.items() if k in spec and not _is_float(spec[k][1])}, **public}

    def take_reference(self, peer: str, part: str, version: int, tensors: Mapping[str, torch.Tensor],
                       spec: Spec) -> dict[str, torch.Tensor]:
        """`peer`'s public copy of `part` at `version`, read whole: held from now on."""
        public = {k: v.detach().to("cpu", torch.float32, copy=True) for k, v in tensors.items() if _is_float(spec[k][1])}
        self.held[(peer, part)] = (version, public)
        return dict(tensors)

    def forget(self, peer: str) -> None:
        for key in [k for k in self.held if k[0] == peer]:
            del self.held[key]
