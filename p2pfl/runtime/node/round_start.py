"""The model at a round's start, kept on disk while the node waits for its peers
(`runtime.round_start = "disk"`).

A round reads its start three times: while it trains (FedProx's anchor, output noise's update),
for each peer part that arrives (`runtime.update_bound` measures and pulls back the part's
distance from it), and when it aggregates (FedOpt, FedFoMo). Between the first and the last a
node waits for its peers, most of a round when thousands of nodes share two processes, and every
waiting node held its start copy, a model's size (414 KiB for the CNN). On disk, the node writes
the copy once after training and reads it back for each arriving part and for its aggregation;
what the round computes is the same, bit for bit (tests/runtime/node/test_round_start.py).

The file sits beside the node's checkpoint, written over each round and removed when the node
ends; its BLAKE3 digest, taken as it was written, is checked at every read.

A first round's start is, on every node, the model built from the run's seed: the nodes a process
hosts then wait on one copy of it (`SharedStart`), in memory or on disk alike, and none writes or
reads a file for it.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator, Mapping
from pathlib import Path

import blake3
import torch

from p2pfl.runtime.peer_claims import FlatCopy


class RoundStartDamaged(RuntimeError):
    """The round start's file changed after this node wrote it."""


class SpilledStart(Mapping[str, torch.Tensor]):
    """A `FlatCopy` written to `path`: `load()` gives it back. Its tensors outside the flat buffer
    (another dtype: a batch-norm layer's step count) stay in memory; they are a few bytes."""

    def __init__(self, start: FlatCopy, path: Path) -> None:
        if start.flat is None or start.flat.device.type != "cpu":
            raise ValueError("only a round start gathered in one host buffer can be kept on disk")
        self.path = path
        self.order = tuple(start)
        self.shapes = {k: start[k].shape for k in start.flat_keys}
        self.rest = {k: v for k, v in start.items() if k not in self.shapes}
        self.dtype, self.numel = start.flat.dtype, start.flat.numel()
        raw = start.flat.view(torch.uint8).numpy()
        self.digest = blake3.blake3(raw).digest()
        path.parent.mkdir(parents=True, exist_ok=True)
        # Written over the last round's start, in place: a file made and removed each round cost
        # a node 1 ms of its round, an overwrite 0.03 ms (the same model, the same size).
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, memoryview(raw), 0)
            if os.fstat(fd).st_size != raw.nbytes:
                os.ftruncate(fd, raw.nbytes)
        finally:
            os.close(fd)

    def load(self, scratch: bool = False) -> FlatCopy:
        """The round start, read back into a buffer of its own; `scratch`: into this thread's
        scratch buffer, overwritten by the thread's next such load (for a reader that keeps no
        view of it past its own call: bounding a peer's part)."""
        flat = _scratch(self.numel, self.dtype) if scratch else torch.empty(self.numel, dtype=self.dtype)
        raw = flat.view(torch.uint8).numpy()
        fd = os.open(self.path, os.O_RDONLY)
        try:
            read = os.preadv(fd, [memoryview(raw)], 0)
        finally:
            os.close(fd)
        if read != raw.nbytes or blake3.blake3(raw).digest() != self.digest:
            raise RoundStartDamaged(f"{self.path}: the round start this node wrote changed on disk "
                                    f"({read} of {raw.nbytes} bytes read, or another digest)")
        return FlatCopy.over(flat, self.shapes, self.rest, self.order)

    def own_copy(self) -> FlatCopy:
        """The round start in memory, a copy of its own (for a strategy's aggregation)."""
        return self.load()

    # A Mapping for code that only asks which tensors it has; reading values loads the file.
    def __len__(self) -> int:
        return len(self.order)

    def __iter__(self) -> Iterator[str]:
        return iter(self.order)

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.load()[key]


def loaded(start: Mapping[str, torch.Tensor], *, scratch: bool = False) -> Mapping[str, torch.Tensor]:
    """`start` with its values at hand: read back once if it is on disk (`scratch`: as `load`'s)."""
    return start.load(scratch) if isinstance(start, SpilledStart) else start


_THREAD = threading.local()


def _scratch(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """This thread's buffer for loads whose values are not kept: a node bounds each arriving part
    on its event loop's thread, and a new buffer each time was a model's size of pages to fault in."""
    buffer = getattr(_THREAD, "buffer", None)
    if buffer is None or buffer.numel() != numel or buffer.dtype != dtype:
        _THREAD.buffer = buffer = torch.empty(numel, dtype=dtype)
    return buffer


class SharedStart(FlatCopy):
    """A round start several nodes of this process wait on at once (`shared_start`): read-only
    to them all; a strategy's aggregation gets a copy of its own (`own_copy`)."""

    def own_copy(self) -> FlatCopy:
        return FlatCopy(self)


_SHARED_LOCK = threading.Lock()  # the nodes' rounds train in a pool's threads
_shared: weakref.ref[SharedStart] | None = None


def shared_start(start: FlatCopy) -> SharedStart | None:
    """The process's one copy of `start` where another node's round start in it holds the same
    tensors, bit for bit (the first round's: the model every node builds from the run's seed);
    None where it does not, and `start` becomes that copy for the nodes after it. The copy lives
    as long as a node waits on it."""
    global _shared
    if start.flat is None:
        return None
    with _SHARED_LOCK:
        held = _shared() if _shared is not None else None
        if held is None:
            held = SharedStart.over(start.flat, {k: start[k].shape for k in start.flat_keys},
                                    {k: v for k, v in start.items() if k not in start.flat_keys}, tuple(start))
            _shared = weakref.ref(held)
            return held
    if _same(held, start):
        return held
    return None


def _same(held: FlatCopy, start: FlatCopy) -> bool:
    assert held.flat is not None and start.flat is not None
    if tuple(held) != tuple(start) or held.flat_keys != start.flat_keys:
        return False
    if any(held[k].shape != start[k].shape for k in held.flat_keys):
        return False
    if held.flat.dtype != start.flat.dtype or held.flat.device != start.flat.device:
        return False
    rest = [k for k in held if k not in held.flat_keys]
    return (torch.equal(held.flat, start.flat)
            and all(held[k].dtype == start[k].dtype and torch.equal(held[k], start[k]) for k in rest))
